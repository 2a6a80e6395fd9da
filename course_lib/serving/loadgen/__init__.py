"""A client-side load generator for an OpenAI-compatible server, in the manner of vLLM's ``benchmark_serving.py``.

    timed = schedule(make_workload(pool, 32), rate=4.0)             # Poisson arrivals, 4 req/s
    result = run_load(server.url, timed, slo=SLO(ttft_s=0.5, tpot_s=0.05))
    print(result.table())
    baseline = measure_engine(engine, timed)                         # the same requests, in-process
    print(server_overhead(result, baseline))                         # what HTTP + SSE add to p50 TPOT

Every request streams; the client stamps each chunk with ``time.perf_counter()`` as it arrives, so TTFT
includes the network, the server's queue and prefill, and TPOT/ITL the server's per-token path (event hop,
detokenize, SSE write) on top of the engine's step. The numbers are ``course_lib.measure.metrics.RequestTrace``s,
so percentiles, throughput and goodput come from ``summarize`` exactly as for in-process runs. A request
that fails (429, 504, a broken stream) keeps its error and counts against goodput.

The parts: ``timed_requests`` (what to send, and when), ``http_client`` (``run_load``), ``in_process``
(``measure_engine``, the baseline), ``results`` (``LoadResult``), ``overhead`` (``server_overhead``) and
``__main__`` (``python -m course_lib.serving.loadgen --url http://127.0.0.1:8000 --n 32 --rate 4``).
Introduced in 06_batching_serving.ipynb.
"""

from course_lib.serving.loadgen.http_client import run_load, run_load_async
from course_lib.serving.loadgen.in_process import measure_engine
from course_lib.serving.loadgen.overhead import Overhead, server_overhead
from course_lib.serving.loadgen.results import LOADGEN_PS, LoadResult, RequestResult
from course_lib.serving.loadgen.timed_requests import TimedRequest, schedule

__all__ = [
    "LOADGEN_PS",
    "LoadResult",
    "Overhead",
    "RequestResult",
    "TimedRequest",
    "measure_engine",
    "run_load",
    "run_load_async",
    "schedule",
    "server_overhead",
]
