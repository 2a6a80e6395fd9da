"""PagedAttention: the block allocator, the paged backend against the contiguous one, the paged-decode kernel."""

import pytest
import torch

import course_lib  # noqa: F401  (TRITON_INTERPRET before Triton)
from course_lib.engine import Engine, SamplingParams, SchedulerConfig
from course_lib.engine.attention import ContiguousBackend
from course_lib.engine.attention.base import sdpa
from course_lib.engine.attention.block_manager import BlockManager, OutOfBlocks
from course_lib.engine.attention.paged import PagedBackend
from course_lib.engine.model import LlamaEngineModel
from course_lib.kernels import HAS_TRITON
from course_lib.kernels.paged_decode import paged_decode, paged_decode_ref
from course_lib.kv.paged_memory import fragmentation, request_mix, sharing
from tests.conftest import flat_step, random_llama

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton not installed")


# ----------------------------------------------------------------------------- the allocator
@pytest.mark.parametrize("bs", [0, 3, 12, -16, 2.0, True])
def test_block_size_must_be_a_power_of_two(bs):
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(8, bs)


def test_refcounts_double_free_and_shared_free():
    bm = BlockManager(4, 4)
    a = bm.allocate()
    assert (a, bm.num_free, bm.ref_count(a)) == (0, 3, 1)
    bm.incref(a)
    with pytest.raises(ValueError, match="still referenced by 2"):
        bm.free(a)
    assert bm.decref(a) is False and bm.ref_count(a) == 1
    bm.free(a)
    assert bm.num_free == 4
    with pytest.raises(ValueError, match="double free"):
        bm.free(a)
    with pytest.raises(ValueError, match="double free"):
        bm.decref(a)
    with pytest.raises(ValueError, match="free"):
        bm.incref(a)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        bm.free(7)


def test_out_of_blocks_is_recoverable_and_changes_nothing():
    bm = BlockManager(4, 4)
    a, b = bm.new_seq(), bm.new_seq()
    bm.append(a, 10)  # 3 blocks
    assert bm.can_allocate(4) and not bm.can_allocate(5) and not bm.can_append(b, 5)
    before = (dict(bm.lengths), {s: list(t) for s, t in bm.tables.items()}, bm.num_free)
    with pytest.raises(OutOfBlocks, match="needs 2 blocks.*1 of 4 free"):
        bm.append(b, 5)
    assert (dict(bm.lengths), {s: list(t) for s, t in bm.tables.items()}, bm.num_free) == before
    bm.free_seq(a)  # the caller preempts a and retries
    assert bm.append(b, 5) == [] and bm.tables[b] == [0, 1] and bm.num_free == 2
    st = bm.stats()
    assert (st.used, st.free, st.tokens, st.utilisation) == (2, 2, 5, 0.5)
    bm.allocate(), bm.allocate()
    with pytest.raises(OutOfBlocks, match="need 1 block, 0 of 4 free"):
        bm.allocate()


def test_fork_shares_and_copies_on_write_truncate_frees_whole_blocks():
    bm = BlockManager(8, 4)
    p = bm.new_seq()
    bm.append(p, 6)  # blocks [0, 1], the second half full
    c = bm.fork(p)
    assert bm.tables[c] == [0, 1] and bm.ref_count(1) == 2 and bm.num_used == 2
    assert bm.stats().logical == 4 and bm.stats().tokens == 6
    assert bm.append(c, 1) == [(1, 2)]  # the child writes into the shared partial block: copied first
    assert bm.tables[c] == [0, 2] and bm.tables[p] == [0, 1] and bm.ref_count(0) == 2 and bm.ref_count(1) == 1
    assert bm.append(p, 2) == []  # now the parent owns block 1 alone: written in place
    bm.truncate(p, 3)  # back into block 0, still shared with the child
    assert bm.tables[p] == [0] and bm.num_free == 6  # block 1 went back; blocks 0 (shared) and 2 (child) remain
    assert bm.append(p, 1) == [(0, 1)]  # block 0 holds 4 slots but p only 3: writing slot 3 copies it
    with pytest.raises(ValueError, match="truncate length"):
        bm.truncate(p, 9)
    bm.free_seq(p), bm.free_seq(c)
    assert bm.num_free == 8 and not bm.tables


# ----------------------------------------------------------------------------- the backend in a model
def backends(m, block_size=4, num_blocks=64, decode="gather"):
    cont = ContiguousBackend(m.num_layers, m.num_kv_heads, m.head_dim, 64, 6)
    paged = PagedBackend(m.num_layers, m.num_kv_heads, m.head_dim, num_blocks, block_size, 64, decode=decode)
    return cont, paged


@pytest.fixture(scope="module")
def small():
    return LlamaEngineModel(random_llama(seed=3))  # 2 layers, 4 heads, 2 KV heads, head_dim 16


def _prompts(lens, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 101, (n,), generator=g).tolist() for n in lens]


@torch.no_grad()
def test_paged_logits_equal_contiguous_prefill_decode_and_mixed(small):
    m = small
    cont, paged = backends(m)
    prompts = _prompts((9, 5, 30, 3, 17))
    out = {}
    for name, kv in (("cont", cont), ("paged", paged)):
        h = [kv.allocate() for _ in prompts]
        a = flat_step(m, kv, [h[0], h[1], h[3]], [prompts[0], prompts[1], prompts[3]])  # ragged prefill
        b = flat_step(m, kv, [h[2]], [prompts[2][:12]])  # the first chunk of a long prompt
        c = flat_step(m, kv, h, [[7], [8], prompts[2][12:], [9], prompts[4]])  # decode + chunk + prefill
        d = flat_step(m, kv, h, [[1], [2], [3], [4], [5]])  # pure decode, ragged lengths
        e = flat_step(m, kv, [h[4]], [[6]])  # one sequence decoding alone
        out[name] = (a, b, c, d, e)
    for x, y in zip(out["paged"], out["cont"]):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    # 11, 7, 31, 5, 19 tokens in blocks of 4: 3+2+8+2+5 blocks, less than one block of waste each
    assert paged.blocks.num_used == 20
    assert paged.bytes_used() == 73 * paged.bytes_per_token
    assert paged.bytes_reserved() == 20 * 4 * paged.bytes_per_token
    assert cont.bytes_reserved() == 5 * 64 * cont.bytes_per_token


@torch.no_grad()
def test_truncate_rolls_back_like_contiguous(small):
    """Speculative rollback: verify γ+1 tokens, keep some, continue; whole blocks past the cut are freed."""
    m = small
    cont, paged = backends(m)
    [p] = _prompts((6,), seed=2)
    logits = {}
    for name, kv in (("cont", cont), ("paged", paged)):
        h = kv.allocate()
        flat_step(m, kv, [h], [p])
        flat_step(m, kv, [h], [[11, 12, 13, 14, 15, 16]])  # 12 tokens: blocks 0..2
        if name == "paged":
            assert kv.blocks.num_used == 3
        kv.truncate(h, 7)  # keep the first drafted token only
        if name == "paged":
            assert kv.blocks.num_used == 2 and kv.length(h) == 7
        logits[name] = flat_step(m, kv, [h], [[21, 22, 23]])
    torch.testing.assert_close(logits["paged"], logits["cont"], atol=1e-5, rtol=1e-5)
    # and equal to running the kept tokens from scratch
    fresh = PagedBackend(m.num_layers, m.num_kv_heads, m.head_dim, 16, 4, 64)
    ref = flat_step(m, fresh, [fresh.allocate()], [p + [11, 21, 22, 23]])[-3:]
    torch.testing.assert_close(logits["paged"], ref, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_fork_shares_until_written_and_parent_is_unaffected(small):
    m = small
    cont, paged = backends(m)
    [p] = _prompts((10,), seed=4)
    res = {}
    for name, kv in (("cont", cont), ("paged", paged)):
        parent = kv.allocate()
        flat_step(m, kv, [parent], [p])
        child = kv.fork(parent)
        if name == "paged":
            assert kv.blocks.num_used == 3 and kv.bytes_reserved() == 3 * kv.bytes_per_block
            assert kv.bytes_unshared() == 6 * kv.bytes_per_block and kv.bytes_used() == 10 * kv.bytes_per_token
        both = flat_step(m, kv, [parent, child], [[31], [32]])  # different tokens into the shared block
        if name == "paged":
            t_p, t_c = kv.blocks.tables[parent], kv.blocks.tables[child]
            assert t_p[:2] == t_c[:2] and t_p[2] != t_c[2] and kv.blocks.num_used == 4  # one block copied
        more = flat_step(m, kv, [child], [[33]])
        res[name] = (both, more)
    for x, y in zip(res["paged"], res["cont"]):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    # the parent continues exactly as if it had never been forked
    solo = PagedBackend(m.num_layers, m.num_kv_heads, m.head_dim, 16, 4, 64)
    ref = flat_step(m, solo, [solo.allocate()], [p + [31]])[-1]
    torch.testing.assert_close(res["paged"][0][0], ref, atol=1e-5, rtol=1e-5)
    ref_c = flat_step(m, solo, [solo.allocate()], [p + [32, 33]])[-2:]
    torch.testing.assert_close(torch.stack([res["paged"][0][1], res["paged"][1][0]]), ref_c, atol=1e-5, rtol=1e-5)


@needs_triton
@torch.no_grad()
def test_backend_decode_kernel_equals_gather(small):
    m = small
    _, gather = backends(m)
    _, kernel = backends(m, decode="kernel")
    prompts = _prompts((5, 11, 2), seed=5)
    outs = []
    for kv in (gather, kernel):
        h = [kv.allocate() for _ in prompts]
        flat_step(m, kv, h, prompts)
        outs.append(flat_step(m, kv, h, [[1], [2], [3]]))  # "decode": the Triton kernel (interpreted)
        outs.append(flat_step(m, kv, h, [[4], [5, 6], [7]]))  # "mixed": its decode group too
    torch.testing.assert_close(outs[2], outs[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[3], outs[1], atol=1e-5, rtol=1e-5)


def test_backend_checks():
    with pytest.raises(ValueError, match="power of two"):
        PagedBackend(2, 2, 16, 8, 6)
    with pytest.raises(ValueError, match="decode"):
        PagedBackend(2, 2, 16, 8, 4, decode="fast")
    with pytest.raises(ValueError, match="head_dim"):
        PagedBackend(2, 2, 24, 8, 4, decode="kernel")
    kv = PagedBackend(1, 1, 16, 4, 4, max_len=12)
    assert kv.max_tokens_per_seq() == 12 and not kv.can_allocate(13)
    h = kv.allocate()
    kv.append(h, 12)
    with pytest.raises(ValueError, match="max_len"):
        kv.append(h, 1)
    h2 = kv.allocate()
    with pytest.raises(OutOfBlocks):
        kv.append(h2, 5)
    assert kv.length(h2) == 0 and kv.blocks.num_free == 1
    kv.free(h)
    with pytest.raises(ValueError, match="not a live sequence"):
        kv.free(h)


# ----------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def tiny():
    from course_lib.models.load import load_model

    return load_model("tiny-target")


def _engine(tiny, paged: bool, num_blocks: int | None = None, max_num_seqs: int = 4) -> Engine:
    hf, tok = tiny
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=256)
    backend = None
    if paged:
        backend = PagedBackend.for_model(LlamaEngineModel(hf), cfg, block_size=16)
        if num_blocks is not None:
            backend = PagedBackend(
                backend.num_layers, backend.num_kv_heads, backend.head_dim, num_blocks, 16, 256, backend.dtype
            )
    return Engine(hf, tok, config=cfg, backend=backend)


PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path, verbose=False):\n        self.path",
    "x",
    "for i in range(10):\n    print(i",
]


@torch.no_grad()
def test_engine_greedy_paged_identical_to_contiguous(tiny):
    hf, tok = tiny
    m = LlamaEngineModel(hf)
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    cont = ContiguousBackend(m.num_layers, m.num_kv_heads, m.head_dim, 64, 4)
    paged = PagedBackend.for_model(m, SchedulerConfig(max_num_seqs=4, max_model_len=64))
    logits = []
    for kv in (cont, paged):
        h = [kv.allocate() for _ in ids]
        logits.append([flat_step(m, kv, h, ids), flat_step(m, kv, h, [[5], [6], [7], [8]])])
    for x, y in zip(*logits):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    ref = _engine(tiny, paged=False).generate(PROMPTS, params)
    eng = _engine(tiny, paged=True)
    seen = []
    out = eng.generate(PROMPTS, params, on_token=lambda ev: seen.append(eng.kv_usage()))
    assert [r.output_ids for r in out] == [r.output_ids for r in ref]
    per_block = eng.backend.bytes_per_block
    assert all(u["reserved"] - u["used"] < len(PROMPTS) * per_block for u in seen)  # < one block per sequence
    assert eng.backend.blocks.num_used == 0  # every sequence freed its blocks
    # a pool too small for all four at once: the scheduler preempts and recomputes, same tokens
    tight = _engine(tiny, paged=True, num_blocks=6)
    seqs = [tight.add_request(p, params) for p in PROMPTS]
    while tight.has_unfinished():
        tight.step()
    assert [s.output_ids for s in seqs] == [r.output_ids for r in ref]
    assert sum(s.num_preemptions for s in seqs) > 0 and tight.backend.blocks.num_used == 0


def test_engine_beam_search_paged_identical_to_contiguous(tiny):
    """Beam search forks and frees beams at every step: the paged backend shares their blocks."""
    ref = _engine(tiny, paged=False, max_num_seqs=8).beam_search(PROMPTS[0], num_beams=3, max_new_tokens=6)
    eng = _engine(tiny, paged=True, max_num_seqs=8)
    assert eng.beam_search(PROMPTS[0], num_beams=3, max_new_tokens=6) == ref
    assert eng.backend.blocks.num_used == 0


def test_engine_kv_cache_option(tiny):
    """``Engine(..., kv_cache="paged", block_size=16)``: skipped until the engine grows the option."""
    import inspect

    if "kv_cache" not in inspect.signature(Engine).parameters:
        pytest.skip("Engine(kv_cache=...) is not there yet; Engine(backend=PagedBackend.for_model(...)) works")
    hf, tok = tiny
    eng = Engine(hf, tok, config=SchedulerConfig(max_num_seqs=4, max_model_len=256), kv_cache="paged", block_size=16)
    assert isinstance(eng.backend, PagedBackend) and eng.backend.block_size == 16
    assert eng.backend.num_blocks == 4 * 256 // 16 and eng.backend.max_tokens_per_seq() == 256
    with pytest.raises(ValueError, match="kv_cache"):
        Engine(hf, tok, kv_cache="ring")


# ----------------------------------------------------------------------------- the kernel
def _paged_case(B, H, Hkv, d, bs, lens, dtype, seed=0):
    """Random contiguous K/V (B, Hkv, L, d) and the same values scattered into a shuffled paged pool."""
    g = torch.Generator().manual_seed(seed)
    L = max(lens)
    max_blocks = -(-L // bs)
    num_blocks = B * max_blocks + 3
    k = torch.randn(B, Hkv, L, d, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, d, generator=g).to(dtype)
    q = torch.randn(B, H, d, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)
    tables = perm[: B * max_blocks].view(B, max_blocks).to(torch.int32)
    k_cache = torch.randn(num_blocks, bs, Hkv, d, generator=g).to(dtype)  # garbage outside the contexts
    v_cache = torch.randn(num_blocks, bs, Hkv, d, generator=g).to(dtype)
    for b in range(B):
        for t in range(lens[b]):
            k_cache[tables[b, t // bs], t % bs] = k[b, :, t]
            v_cache[tables[b, t // bs], t % bs] = v[b, :, t]
    return q, k, v, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


#: Triton runs compiled on a GPU, interpreted on a CPU: the kernel test uses this device.
DEV = "cuda" if torch.cuda.is_available() else "cpu"

CASES = [  # B, H, Hkv, d, bs, lens, dtype
    (3, 4, 2, 16, 4, [5, 1, 13], torch.float32),
    (2, 8, 1, 32, 8, [17, 9], torch.float32),
    (2, 6, 3, 16, 16, [33, 16], torch.float16),
    (1, 2, 2, 64, 2, [7], torch.float32),
    (3, 8, 2, 32, 16, [40, 1, 16], torch.float32),  # bs >= 16: the tl.dot path
]


@needs_triton
@pytest.mark.parametrize("B,H,Hkv,d,bs,lens,dtype", CASES)
def test_kernel_matches_reference_and_contiguous_attention(B, H, Hkv, d, bs, lens, dtype):
    q, k, v, k_cache, v_cache, tables, ctx = _paged_case(B, H, Hkv, d, bs, lens, dtype)
    dev = [t.to(DEV) for t in (q, k_cache, v_cache, tables, ctx)]
    out = paged_decode(*dev, path="triton").cpu()
    ref = paged_decode_ref(q, k_cache, v_cache, tables, ctx)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert out.dtype == dtype and out.shape == (B, H, d)
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    mask = (torch.arange(max(lens))[None, :] < ctx[:, None])[:, None, None]  # (B, 1, 1, L)
    cont = sdpa(q[:, :, None].float(), k.float(), v.float(), mask, use_sdpa=False)[:, :, 0]  # (B, H, d)
    torch.testing.assert_close(out.float(), cont, atol=tol, rtol=tol)
    torch.testing.assert_close(paged_decode(q, k_cache, v_cache, tables, ctx, path="torch"), ref)


def test_kernel_launcher_checks():
    q, _, _, kc, vc, tables, ctx = _paged_case(2, 4, 2, 16, 4, [5, 3], torch.float32)
    with pytest.raises(ValueError, match="head_dim must be one of"):
        paged_decode(q[..., :8].contiguous(), kc[..., :8].contiguous(), vc[..., :8].contiguous(), tables, ctx)
    with pytest.raises(ValueError, match="power of two"):
        paged_decode(q, kc[:, :3].contiguous(), vc[:, :3].contiguous(), tables, ctx)
    with pytest.raises(ValueError, match="dtype"):
        paged_decode(q, kc.half(), vc.half(), tables, ctx)
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        paged_decode(q[:, :3].contiguous(), kc, vc, tables, ctx)
    with pytest.raises(ValueError, match="context_lens must lie"):
        paged_decode(q, kc, vc, tables, torch.tensor([5, 99], dtype=torch.int32))
    with pytest.raises(ValueError, match="context_lens must lie"):
        paged_decode(q, kc, vc, tables, torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="name blocks"):
        paged_decode(q, kc, vc, tables + 100, ctx)
    with pytest.raises(ValueError, match="path"):
        paged_decode(q, kc, vc, tables, ctx, path="cuda")


# ----------------------------------------------------------------------------- memory on a request mix
def test_fragmentation_and_sharing_on_a_request_mix():
    mix = request_mix(300, seed=0)
    assert mix == request_mix(300, seed=0) and all(p + o <= 2048 for p, o in mix)
    f = fragmentation(mix, max_model_len=2048, block_size=16)
    assert f.waste("paged") < 0.04 < 0.6 < f.waste("max_len")
    assert 0 < f.waste("oracle") < f.waste("max_len")
    s = sharing(mix[:50], n=4, block_size=16)
    assert s.shared_blocks < s.copied_blocks and 0 < s.saving < 0.75
    assert s.copy_on_write == 3 * sum(p % 16 != 0 for p, _ in mix[:50])  # n−1 copies per partial last block


def test_paged_engine_greedy_equals_transformers_generate():
    """The paged backend against Hugging Face itself, not only against the contiguous backend."""
    eng = Engine("tiny-target", kv_cache="paged", block_size=16)
    ids = eng.encode(["def fibonacci(n):"])[0]
    ours = eng.generate([ids], SamplingParams(max_new_tokens=20, ignore_eos=True))[0].output_ids
    x = torch.tensor([ids])
    with torch.inference_mode():
        hf = eng.hf_model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=20,
            min_new_tokens=20,
            do_sample=False,
            pad_token_id=eng.tokenizer.pad_token_id,
        )[0, len(ids) :].tolist()
    assert ours == hf
