"""The fused / compiled / CUDA-graph decode step against the eager reference, and the lever measurements."""

import warnings

import pytest
import torch

from course_lib.bottlenecks import step_levers
from course_lib.engine import Engine, SamplingParams, SchedulerConfig
from course_lib.engine.fast_decode import FastDecoder, bucket, decode_forward, kv_bucket

PROMPTS = ["def fib(n):", "import os\nimport sys\n\n\nclass Foo:\n    x", "x = 1 +"]  # odd, unequal lengths


@pytest.fixture(scope="module")
def tiny():
    return Engine("tiny-target", config=SchedulerConfig(max_model_len=256, max_num_seqs=4))


@torch.inference_mode()  # as Engine.step runs every forward
def _decode_logits(engine, prompts, lever):
    """Prefill ``prompts`` with the reference, then one decode step's logits through ``lever``."""
    step_levers.set_lever(engine, "eager")
    be, rows, ids = engine.backend, [], engine.encode(prompts)
    for p in ids:
        row = be.allocate()
        be.append(row, len(p))
        engine.forward([row], [p], [0])
        be.append(row, 1)
        rows.append(row)
    nxt = [[p[-1]] for p in ids]
    starts = [len(p) for p in ids]
    try:
        ref = engine.forward(rows, nxt, starts)
        step_levers.set_lever(engine, lever)
        out = engine.forward(rows, nxt, starts)
    finally:
        step_levers.set_lever(engine, "eager")
        for r in rows:
            be.free(r)
    return ref, out


@pytest.mark.parametrize("batch", [1, 3])
def test_fused_logits_match_eager(tiny, batch):
    ref, out = _decode_logits(tiny, PROMPTS[:batch], "fused")
    assert out.shape == ref.shape == (batch, tiny.model.vocab_size)
    assert torch.allclose(out, ref, atol=1e-5, rtol=0)  # in practice bit for bit: the same keys, the same sums
    assert torch.equal(out.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("batch", [1, 3])
def test_fused_greedy_output_identical(tiny, batch):
    p = SamplingParams(max_new_tokens=17, ignore_eos=True)
    want = [r.output_ids for r in tiny.generate(PROMPTS[:batch], p)]
    fast = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, decode="fused")
    assert [r.output_ids for r in fast.generate(PROMPTS[:batch], p)] == want


def test_padded_batch_gives_the_real_rows(tiny):
    """A batch padded to its bucket by repeating the last row: the real rows' logits do not change."""
    m, be = tiny.model, tiny.backend
    rows = [be.allocate() for _ in range(3)]
    for r in rows:
        be.append(r, 9)
    ids, pos, rt = torch.tensor([5, 7, 11]), torch.tensor([8, 8, 8]), torch.tensor(rows)
    try:
        with torch.inference_mode():
            a = decode_forward(m, be.k, be.v, ids, pos, rt, 64)
            pad = lambda t: torch.cat([t, t[-1:]])  # noqa: E731
            b = decode_forward(m, be.k, be.v, pad(ids), pad(pos), pad(rt), 64)
    finally:
        for r in rows:
            be.free(r)
    assert b.shape[0] == 4 and torch.allclose(a, b[:3], atol=1e-5, rtol=0)  # 4 rows: another kernel blocking
    assert torch.equal(a.argmax(-1), b[:3].argmax(-1))


def test_buckets():
    assert [bucket(n, (1, 2, 4, 8)) for n in (1, 3, 8, 9)] == [1, 4, 8, 9]
    assert kv_bucket(1, 256) == 64 and kv_bucket(65, 256) == 128 and kv_bucket(250, 200) == 200


def test_other_steps_run_the_reference(tiny):
    """A prefill chunk, or a backend the fast path does not know, goes to the reference forward."""
    fd = FastDecoder(tiny.model, "fused")
    assert fd.supports(tiny.backend, [1, 1], [5, 9])
    assert not fd.supports(tiny.backend, [1, 4], [5, 9])
    assert not fd.supports(tiny.backend, [1], [tiny.backend.max_len + 1])
    paged = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, kv_cache="paged", decode="fused")
    assert not fd.supports(paged.backend, [1], [5])
    p = SamplingParams(max_new_tokens=5, ignore_eos=True)
    assert [r.output_ids for r in paged.generate(PROMPTS[:2], p)] == [
        r.output_ids for r in tiny.generate(PROMPTS[:2], p)
    ]


def test_bad_mode_is_rejected(tiny):
    with pytest.raises(ValueError, match="decode must be one of"):
        Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, decode="turbo")
    with pytest.raises(ValueError, match="mode must be one of"):
        FastDecoder(tiny.model, "eager")


def test_compile_failure_falls_back_with_one_warning(tiny, monkeypatch):
    def broken(fn, **kwargs):
        def run(*a, **k):
            raise RuntimeError("no C++ compiler found (forced by the test)")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    ref, _ = _decode_logits(tiny, PROMPTS[:2], "fused")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, decode="compiled")
        p = SamplingParams(max_new_tokens=6, ignore_eos=True)
        got = [r.output_ids for r in fast.generate(PROMPTS[:2], p)]
    mine = [w for w in caught if "decode mode 'compiled' unavailable" in str(w.message)]
    assert len(mine) == 1 and "no C++ compiler" in str(mine[0].message)
    assert fast.fast.mode == "fused"
    assert got == [r.output_ids for r in tiny.generate(PROMPTS[:2], p)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU message is for machines without CUDA")
def test_cudagraph_on_cpu_routes_to_fused_with_a_message(tiny):
    with pytest.warns(UserWarning, match="CUDA graphs need a CUDA device"):
        fast = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, decode="cudagraph")
    assert fast.fast.mode == "fused"
    p = SamplingParams(max_new_tokens=5, ignore_eos=True)
    assert [r.output_ids for r in fast.generate(PROMPTS, p)] == [r.output_ids for r in tiny.generate(PROMPTS, p)]


class _ReplayGraph:
    """A CUDA graph's contract, on a CPU: capture records the ops one call ran on fixed tensors; replay runs
    those ops again, on the same input tensors, and leaves the results in the tensors the capture returned.
    Python in the step runs once, at capture, exactly as with a real graph, so a step that reads its inputs
    anywhere but its static buffers, or bakes a value into Python, replays stale."""

    def __init__(self) -> None:
        self.ops: list = []
        self.replays = 0

    def replay(self) -> None:
        from torch.utils._pytree import tree_leaves, tree_map

        self.replays += 1
        new: dict[int, torch.Tensor] = {}
        sub = lambda a: new.get(id(a), a) if isinstance(a, torch.Tensor) else a  # noqa: E731
        for func, args, kwargs, out in self.ops:
            got = func(*tree_map(sub, args), **tree_map(sub, kwargs))
            for o, g in zip(tree_leaves(out), tree_leaves(got)):
                if isinstance(o, torch.Tensor):
                    new[id(o)] = g
        for _, _, _, out in self.ops:  # the captured buffers (not views) take the replayed values
            for o in tree_leaves(out):
                if isinstance(o, torch.Tensor) and o._base is None and new[id(o)].data_ptr() != o.data_ptr():
                    o.copy_(new[id(o)])


def _fake_cuda_graphs(monkeypatch):
    """torch.cuda's graph API replaced by ``_ReplayGraph``; a host sync during capture raises, as CUDA's does.
    The course's C kernels (ctypes calls, invisible to the dispatcher, and never on a GPU) are switched off,
    so a step is torch ops only, as on a GPU."""
    import contextlib

    from course_lib.kernels import cpu_gemv

    monkeypatch.setattr(cpu_gemv, "available", lambda: False)

    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    SYNCS = (aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default)  # int(t), t.item(), bool(t)

    class Record(TorchDispatchMode):
        """Runs each op (its outputs are the graph's buffers) and notes what it wrote in existing memory, to
        put back afterwards: a real capture only records, it runs nothing."""

        def __init__(self, graph):
            super().__init__()
            self.graph, self.saved = graph, {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in SYNCS:
                raise RuntimeError("operation not permitted when stream is capturing (a host sync: .item())")
            given = dict(zip((a.name for a in func._schema.arguments), args)) | kwargs
            for a in func._schema.arguments:
                t = given.get(a.name)
                if isinstance(t, torch.Tensor) and a.alias_info is not None and a.alias_info.is_write:
                    self.saved.setdefault((t.data_ptr(), t.shape, t.stride()), (t, t.clone()))
            out = func(*args, **kwargs)
            self.graph.ops.append((func, args, kwargs, out))
            return out

    @contextlib.contextmanager
    def graph(g, *a, **k):
        rec = Record(g)
        with rec:
            yield
        for t, before in reversed(list(rec.saved.values())):
            t.copy_(before)

    class Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _ReplayGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())


def test_graph_capture_and_replay_plumbing_on_cpu(tiny, monkeypatch):
    """The graph path's own code (static buffers, batch buckets, the warm-up's restored slot, graphs
    dropped when the cache is new) against eager, with torch.cuda's graph API emulated: greedy output
    identical over 12 steps at batches 1 and 3, every step a replay. What it cannot check: CUDA's own
    capture rules beyond host syncs (``test_cudagraph_replay_equals_eager`` does, on a GPU)."""
    _fake_cuda_graphs(monkeypatch)
    p = SamplingParams(max_new_tokens=12, ignore_eos=True)
    ref = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, linear="reference")  # torch's products, as on a GPU
    for batch in (1, 3):
        want = [r.output_ids for r in ref.generate(PROMPTS[:batch], p)]
        fast = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, linear="reference", decode="fused")
        fast.fast.mode = fast.fast.requested = "cudagraph"  # on a CPU the constructor routes it to fused
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a capture failure would fall back with a warning
            got = [r.output_ids for r in fast.generate(PROMPTS[:batch], p)]
        assert got == want
        graphs = fast.fast._graphs
        assert fast.fast.mode == "cudagraph" and set(graphs) == {bucket(batch, fast.fast.batch_buckets)}
        assert sum(g.replays for g, _, _ in graphs.values()) == 11  # every decode step after the prefill's token


def test_graph_capture_refuses_a_host_sync(tiny, monkeypatch):
    """A step that reads a value to Python during capture (CUDA refuses it) falls back with one warning."""
    _fake_cuda_graphs(monkeypatch)
    from course_lib.engine import fast_decode

    real = fast_decode.decode_forward

    def syncing(model, k, v, ids, *rest):
        int(ids[0])  # a host sync
        return real(model, k, v, ids, *rest)

    monkeypatch.setattr(fast_decode, "decode_forward", syncing)
    fast = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, linear="reference", decode="fused")
    fast.fast.mode = "cudagraph"
    p = SamplingParams(max_new_tokens=4, ignore_eos=True)
    with pytest.warns(UserWarning, match="CUDA graph capture failed"):
        got = [r.output_ids for r in fast.generate(PROMPTS[:1], p)]
    assert fast.fast.mode == "fused" and got == [r.output_ids for r in tiny.generate(PROMPTS[:1], p)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("batch", [1, 3])
def test_cudagraph_replay_equals_eager(batch):
    eng = Engine("tiny-target", device="cuda", config=SchedulerConfig(max_model_len=256, max_num_seqs=4))
    ref, out = _decode_logits(eng, PROMPTS[:batch], "cudagraph")
    assert torch.allclose(out, ref, atol=1e-4, rtol=0) and torch.equal(out.argmax(-1), ref.argmax(-1))
    p = SamplingParams(max_new_tokens=12, ignore_eos=True)
    want = [r.output_ids for r in eng.generate(PROMPTS[:batch], p)]
    fast = Engine(eng.hf_model, eng.tokenizer, config=eng.config, decode="cudagraph")
    assert [r.output_ids for r in fast.generate(PROMPTS[:batch], p)] == want
    assert fast.fast.mode == "cudagraph" and fast.fast._graphs


@pytest.mark.slow
def test_compiled_matches_eager(tiny):
    """torch.compile of the fused step (about a minute of inductor on 2 cores)."""
    torch.set_num_threads(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref, out = _decode_logits(tiny, PROMPTS[:3], "compiled")
    fell_back = [str(w.message) for w in caught if "unavailable" in str(w.message)]
    assert not fell_back, f"the compiled step fell back to fused, so this compared fused: {fell_back}"
    assert torch.allclose(out, ref, atol=1e-5, rtol=0) and torch.equal(out.argmax(-1), ref.argmax(-1))


@pytest.mark.slow
def test_smollm2_fused_matches_eager(smollm2_cache, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE_DIR", str(smollm2_cache))
    eng = Engine("smollm2-135m-instruct", config=SchedulerConfig(max_model_len=128, max_num_seqs=3))
    for batch in (1, 3):
        ref, out = _decode_logits(eng, PROMPTS[:batch], "fused")
        assert torch.allclose(out, ref, atol=1e-5, rtol=0) and torch.equal(out.argmax(-1), ref.argmax(-1))
    p = SamplingParams(max_new_tokens=9, ignore_eos=True)
    want = [r.output_ids for r in eng.generate(PROMPTS, p)]
    fast = Engine(eng.hf_model, eng.tokenizer, config=eng.config, decode="fused")
    assert [r.output_ids for r in fast.generate(PROMPTS, p)] == want


# ---------------------------------------------------------------- the lever verdicts, with counter-examples
def _row(lever, ops, us, vs_hf=None, spread=0.02):
    return step_levers.LeverRow("tiny-target", lever, ops, us, [us, us], 0.0, vs_hf, spread)


def test_verdicts_hold_and_fail():
    eager, comp = _row("eager", 220, 3000.0, 2.2), _row("compiled", 40, 1000.0, 4.0)
    assert step_levers.fewer_ops(eager, comp).held
    assert not step_levers.fewer_ops(eager, _row("fused", 210, 2900.0)).held
    assert step_levers.faster(eager, comp).held
    assert not step_levers.faster(eager, _row("fused", 221, 3500.0)).held
    assert step_levers.hf_goal(comp).held
    assert not step_levers.hf_goal(eager).held
    with pytest.raises(ValueError, match="vs_hf"):
        step_levers.hf_goal(_row("fused", 1, 1.0))


def test_recorded_run_is_labelled():
    rows, prov = step_levers.load_recorded()
    assert {"machine", "command", "date"} <= set(prov) and "step_levers --record" in prov["command"]
    assert {r.lever for r in rows} >= {"eager", "fused", "compiled"}
    assert {r.model for r in rows} == {"tiny-target", "smollm2-135m-instruct"}


def test_measure_lever_rejects_bad_input(tiny):
    with pytest.raises(ValueError, match="lever must be one of"):
        step_levers.set_lever(tiny, "fast")
    with pytest.raises(ValueError, match="repeats"):
        step_levers.measure_lever(tiny, "fused", "tiny-target", repeats=1)


def test_auto_is_the_default_and_says_which_path_ran(tiny):
    """decode="auto": native where the C kernels build, else fused; a step it cannot take runs the next path."""
    from course_lib.engine.fast_decode import auto_decode
    from course_lib.kernels import cpu_gemv

    mode, why = auto_decode("cpu", torch.float32)
    assert mode == ("native" if cpu_gemv.available() else "fused") and why
    assert auto_decode("cpu", torch.bfloat16)[0] == "fused" and auto_decode("cuda", torch.bfloat16)[0] == "cudagraph"
    eng = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config)  # the default
    assert eng.fast is not None and eng.fast.auto and eng.decode_path.startswith(f"auto -> {mode}")
    p = SamplingParams(max_new_tokens=6, ignore_eos=True)
    eager = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, decode="eager")
    assert "reference" in eager.decode_path
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto falls back silently: no warning per step or per reason
        got = [r.output_ids for r in eng.generate(PROMPTS, p)]
    assert got == [r.output_ids for r in eager.generate(PROMPTS, p)]
    assert eng.fast.ran.get(mode, 0) >= 5 and f"{mode} " in eng.decode_path


def test_auto_falls_back_to_fused_without_the_kernels(tiny, monkeypatch):
    from course_lib.kernels import cpu_gemv

    monkeypatch.setattr(cpu_gemv, "available", lambda: False)
    monkeypatch.setattr(cpu_gemv, "unavailable_reason", lambda: "no compiler (test)")
    fd = FastDecoder(tiny.model, "auto")
    assert fd.mode == "fused" and "no compiler (test)" in fd.auto_why
