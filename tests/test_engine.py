"""The engine is correct to the token: logits vs HF, greedy identity with `generate`, every path agrees."""

import pytest
import torch

from course_lib.engine import Engine, SamplingParams
from course_lib.engine.attention import ContiguousBackend
from course_lib.engine.model import LlamaEngineModel
from tests.conftest import flat_step, random_llama

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\nclass Config:\n    def __init__(self", "x"]


def hf_greedy(model, tok, prompt, n):
    ids = tok(prompt, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    return out[0, ids["input_ids"].shape[1] :].tolist()


def new_backend(m, rows=4, max_len=64):
    return ContiguousBackend(m.num_layers, m.num_kv_heads, m.head_dim, max_len, rows)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_logits_match_hf_prefill_ragged_and_decode(kind):
    hf = random_llama(kind=kind, seed=1)
    m = LlamaEngineModel(hf)
    torch.manual_seed(0)
    x = torch.randint(0, 101, (3, 13))
    lens = [13, 7, 1]  # awkward: one prompt of a single token
    with torch.no_grad():
        torch.testing.assert_close(m.dense_logits(x), hf(input_ids=x).logits, atol=1e-5, rtol=1e-5)
        backend = new_backend(m)
        handles = [backend.allocate() for _ in lens]
        prompts = [x[b, :n].tolist() for b, n in enumerate(lens)]
        logits = flat_step(m, backend, handles, prompts)  # a ragged prefill, no padding: (21, V)
        last = logits[torch.tensor(lens).cumsum(0) - 1]
        nxt = torch.randint(0, 101, (3,))
        step = flat_step(m, backend, handles, [[t] for t in nxt.tolist()])  # cached decode, ragged lengths
        for b in range(3):
            seq = x[b, : lens[b]]
            torch.testing.assert_close(last[b], hf(input_ids=seq[None]).logits[0, -1], atol=1e-5, rtol=1e-5)
            full = torch.cat([seq, nxt[b : b + 1]])[None]
            torch.testing.assert_close(step[b], hf(input_ids=full).logits[0, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_mixed_step_equals_separate_forwards(kind):
    """One forward holding a prefill chunk after a cached prefix, a whole prefill and decode tokens gives the
    logits of running each sequence on its own."""
    hf = random_llama(kind=kind, seed=11)
    m = LlamaEngineModel(hf)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 101, (n,), generator=g).tolist() for n in (9, 5, 30, 3, 17)]
    with torch.no_grad():
        mixed = new_backend(m, rows=5)
        h = [mixed.allocate() for _ in prompts]
        flat_step(m, mixed, [h[0], h[1], h[3]], [prompts[0], prompts[1], prompts[3]])  # earlier prefills
        flat_step(m, mixed, [h[2]], [prompts[2][:12]])  # the first chunk of a long prompt
        chunks = [[7], [8], prompts[2][12:], [9], prompts[4]]  # decode, decode, chunk, decode, whole prefill
        logits = flat_step(m, mixed, h, chunks)  # (N, V): one flat ragged step
        ends = torch.tensor([len(c) for c in chunks]).cumsum(0)
        full = [prompts[0] + [7], prompts[1] + [8], prompts[2], prompts[3] + [9], prompts[4]]
        for b, seq in enumerate(full):
            n = len(chunks[b])
            ref = hf(input_ids=torch.tensor([seq])).logits[0, -n:]  # the logits of those n tokens
            torch.testing.assert_close(logits[ends[b] - n : ends[b]], ref, atol=1e-5, rtol=1e-5)


def test_spelled_out_attention_equals_sdpa():
    hf = random_llama(seed=2)
    m = LlamaEngineModel(hf)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [4, 5, 6]]
    with torch.no_grad():
        outs = []
        for use_sdpa in (True, False):
            backend = new_backend(m)
            backend.use_sdpa = use_sdpa
            h = [backend.allocate() for _ in prompts]
            outs.append(
                torch.cat(
                    [
                        flat_step(m, backend, h, prompts),
                        flat_step(m, backend, h, [[3], [4]]),
                        flat_step(m, backend, h[:1], [[1, 2, 3]]),
                    ]
                )
            )
        torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


def test_greedy_identical_to_hf_generate_random_gqa(tokenizer):
    hf = random_llama(tokenizer, seed=3)
    engine = Engine(hf, tokenizer)
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=24))
    for prompt, res in zip(PROMPTS, results):
        assert res.output_ids == hf_greedy(hf, tokenizer, prompt, 24)


@pytest.mark.parametrize("name", ["tiny-target", "tiny-draft"])
def test_greedy_identical_to_hf_generate_embedded(name):
    engine = Engine(name)
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=32))
    for prompt, res in zip(PROMPTS, results):
        assert res.output_ids == hf_greedy(engine.hf_model, engine.tokenizer, prompt, 32), prompt
        assert res.text == engine.tokenizer.decode(res.output_ids, skip_special_tokens=True)


def test_batched_equals_single_and_no_cache_equals_cache(tokenizer):
    engine = Engine(random_llama(tokenizer, seed=4), tokenizer)
    params = SamplingParams(max_new_tokens=12)
    batched = [r.output_ids for r in engine.generate(PROMPTS, params)]
    single = [engine.generate([p], params)[0].output_ids for p in PROMPTS]
    recomputed = [r.output_ids for r in engine.generate(PROMPTS, params, use_kv_cache=False)]
    assert batched == single == recomputed


def test_stops_at_eos_like_hf(tokenizer):
    hf = random_llama(tokenizer, seed=5)
    # make EOS the greedy choice after the first generated token: bias the output layer
    with torch.no_grad():
        hf.lm_head.weight[tokenizer.eos_token_id] = hf.lm_head.weight.mean(0) * 0 + 0.5
    engine = Engine(hf, tokenizer)
    res = engine.generate(["def f"], SamplingParams(max_new_tokens=16))[0]
    ref = hf_greedy(hf, tokenizer, "def f", 16)
    assert res.output_ids == ref
    if tokenizer.eos_token_id in ref:
        assert res.finish_reason == "eos" and res.output_ids[-1] == tokenizer.eos_token_id
    forced = engine.generate(["def f"], SamplingParams(max_new_tokens=16, ignore_eos=True))[0]
    assert len(forced.output_ids) == 16 and forced.finish_reason == "length"


def test_beam_search_matches_hf(tokenizer):
    hf = random_llama(tokenizer, seed=6)
    engine = Engine(hf, tokenizer)
    ids = tokenizer(PROMPTS[0], return_tensors="pt")
    for beams in (2, 4):
        ours = engine.beam_search(PROMPTS[0], num_beams=beams, max_new_tokens=10, ignore_eos=True)
        ref = hf.generate(
            **ids,
            max_new_tokens=10,
            num_beams=beams,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            suppress_tokens=[tokenizer.eos_token_id],
        )
        assert ours == ref[0, ids["input_ids"].shape[1] :].tolist()
    # beam search finds a sequence at least as likely as greedy
    greedy = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=10, ignore_eos=True))[0].output_ids
    beam = engine.beam_search(PROMPTS[0], num_beams=4, max_new_tokens=10, ignore_eos=True)

    def logprob(gen):
        full = torch.tensor([ids["input_ids"][0].tolist() + gen])
        lp = torch.log_softmax(hf(input_ids=full).logits[0, :-1].float(), -1)
        n = ids["input_ids"].shape[1]
        return sum(lp[n - 1 + i, t].item() for i, t in enumerate(gen))

    with torch.no_grad():
        assert logprob(beam) >= logprob(greedy) - 1e-4


def test_seeded_sampling_is_reproducible(tokenizer):
    engine = Engine(random_llama(tokenizer, seed=7), tokenizer)
    p = SamplingParams(temperature=1.0, top_k=20, max_new_tokens=16, seed=11, ignore_eos=True)
    a = engine.generate(PROMPTS[:2], p)
    b = engine.generate(PROMPTS[:2], p)
    c = engine.generate(
        PROMPTS[:2], SamplingParams(temperature=1.0, top_k=20, max_new_tokens=16, seed=12, ignore_eos=True)
    )
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert [r.output_ids for r in a] != [r.output_ids for r in c]


def test_penalties_reduce_repeats():
    engine = Engine("tiny-target")
    prompt = "    for i in range(10):\n"
    plain = engine.generate([prompt], SamplingParams(max_new_tokens=48, ignore_eos=True))[0].output_ids
    pen = engine.generate(
        [prompt], SamplingParams(max_new_tokens=48, ignore_eos=True, frequency_penalty=1.0, presence_penalty=1.0)
    )[0].output_ids
    assert len(set(pen)) > len(set(plain))  # more distinct tokens once repeats cost


def test_trace_and_stream(tokenizer):
    engine = Engine(random_llama(tokenizer, seed=8), tokenizer)
    events = []
    res = engine.generate(["def f(x):"], SamplingParams(max_new_tokens=10, ignore_eos=True), on_token=events.append)[0]
    t = res.trace
    assert t.n_output == len(res.output_ids) == 10 == len(events)
    assert t.token_times == sorted(t.token_times) and t.token_times[0] >= t.arrival
    assert t.ttft > 0 and t.latency >= t.ttft and t.tpot >= 0
    pieces = [piece for piece, _ in engine.stream("def f(x):", SamplingParams(max_new_tokens=10, ignore_eos=True))]
    assert "".join(pieces) == res.text


def test_stream_cuts_at_a_stop_string_like_generate():
    """Engine.stream detokenizes incrementally (TextStream): its pieces add up to generate's text, cut
    before the stop string, and no piece ever contains the stop string's start once it completes."""
    engine = Engine("tiny-target")
    prompt = "def add(a, b):\n"
    free = engine.generate([prompt], SamplingParams(max_new_tokens=24, ignore_eos=True))[0].text
    stop = free[len(free) // 2 : len(free) // 2 + 2]  # a 2-character string the answer is known to contain
    assert stop and stop in free
    params = SamplingParams(max_new_tokens=24, ignore_eos=True, stop=(stop,))
    res = engine.generate([prompt], params)[0]
    pieces = [piece for piece, _ in engine.stream(prompt, params)]
    assert res.finish_reason == "stop" and "".join(pieces) == res.text == free[: free.find(stop)]


def test_bad_input_is_rejected_before_compute(tokenizer):
    engine = Engine(random_llama(tokenizer, seed=9), tokenizer)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([""])
    with pytest.raises(ValueError, match="non-empty list"):
        engine.generate([])
    with pytest.raises(ValueError, match="context window"):
        engine.generate(["x " * 300], SamplingParams(max_new_tokens=8))
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate(["x"], SamplingParams(max_new_tokens=0))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[1, 2, 10**6]])
    with pytest.raises(ValueError, match="tokenizer"):
        Engine(random_llama(seed=1))


def test_contiguous_storage_bookkeeping():
    backend = ContiguousBackend(num_layers=1, num_kv_heads=1, head_dim=4, max_len=8, max_seqs=2)
    per_token = 2 * 1 * 1 * 4 * 4
    assert backend.bytes_per_token == per_token and backend.bytes_used() == backend.bytes_reserved() == 0
    a = backend.allocate()
    backend.append(a, 3)
    assert backend.length(a) == 3 and backend.bytes_used() == 3 * per_token
    assert backend.bytes_reserved() == 8 * per_token  # a whole slab, whatever the length: the waste of ch. 05
    backend.k[0][a, :, :3] = torch.arange(12.0).view(1, 3, 4)
    b = backend.fork(a)
    assert b != a and backend.length(b) == 3 and torch.equal(backend.k[0][b, :, :3], backend.k[0][a, :, :3])
    assert not backend.can_allocate(1)  # both rows taken
    backend.truncate(a, 1)
    assert backend.length(a) == 1
    assert not backend.can_append(b, 6) and backend.can_append(b, 5)
    with pytest.raises(ValueError, match="full"):
        backend.append(b, 6)
    with pytest.raises(ValueError, match="truncate"):
        backend.truncate(a, 2)
    backend.free(a)
    backend.free(b)
    assert backend.bytes_used() == backend.bytes_reserved() == 0
    with pytest.raises(ValueError, match="not a live sequence"):
        backend.free(a)
    with pytest.raises(ValueError, match="max_seqs"):
        ContiguousBackend(1, 1, 4, 8, 0)


def test_rope_in_three_ops_equals_the_textbook_form():
    from course_lib.engine.model import apply_rope, rotate_half

    torch.manual_seed(0)
    x, cos, sin = torch.randn(5, 3, 8), torch.randn(5, 1, 8), torch.randn(5, 1, 8)
    signed = torch.cat((-sin[..., :4], sin[..., 4:]), dim=-1)
    torch.testing.assert_close(apply_rope(x, cos, signed), x * cos + rotate_half(x) * sin, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 16, 17, 40])
@pytest.mark.parametrize("shape", [(2304, 768), (1, 768), (4096, 256), (17, 1000)])
def test_skinny_linear_equals_the_reference(shape, rows):
    from course_lib.engine.layers import Linear, SkinnyLinear

    torch.manual_seed(rows)
    W, b = torch.randn(*shape) / shape[1] ** 0.5, torch.randn(shape[0])
    x = torch.randn(rows, shape[1])
    fast = SkinnyLinear(W, b, min_bytes=0)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), Linear(W, b)(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(SkinnyLinear(W, None, min_bytes=0)(x), Linear(W)(x), atol=1e-5, rtol=1e-5)
    assert SkinnyLinear(W.half(), min_bytes=0).enabled is False  # fp16 on a CPU: the reference path


def test_engine_linear_choice(tokenizer):
    from course_lib.engine.layers import Linear, SkinnyLinear

    hf = random_llama(tokenizer, seed=12)
    kinds = {
        name: {type(lin) for _, lin in Engine(hf, tokenizer, linear=name).model.linears()}
        for name in ("reference", "skinny")
    }
    assert kinds == {"reference": {Linear}, "skinny": {SkinnyLinear}}
    ref = Engine(hf, tokenizer, linear="reference").generate(PROMPTS, SamplingParams(max_new_tokens=12))
    fast = Engine(hf, tokenizer, linear="skinny").generate(PROMPTS, SamplingParams(max_new_tokens=12))
    assert [r.output_ids for r in ref] == [r.output_ids for r in fast]
    with pytest.raises(ValueError, match="linear must be one of"):
        Engine(hf, tokenizer, linear="fast")
