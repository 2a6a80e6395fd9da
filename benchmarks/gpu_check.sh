#!/usr/bin/env bash
# One pass over every GPU path of the course, for a short loan of a CUDA machine (about 9 minutes).
#
#     OUT=/some/dir bash benchmarks/gpu_check.sh [deadline_s] [part]
#
# part: "all" (default), "kernels" (steps 1-4), "engine" (steps 2-3 only: issue 21's goals, about 4 minutes)
# or "notebooks" (step 5 only, every chapter): parts fit two short runs of a 15-minute loan when one pass
# does not. Afterwards, on the machine that has $OUT:
#     python benchmarks/gpu_collect.py $OUT     # rewrites data/measurements/<gpu>.json from the run
#     python benchmarks/ledger.py               # the performance ledger reads the GPU goals from it
#
# Runs, in order of value, each step under its own time limit and skipped once the deadline is near:
#   1. the kernel tests with the Triton compiler (TRITON_INTERPRET=0): flash attention, paged decode,
#      int8/int4 matmul, 2:4 pruning, the intensity kernel, transfers, hardware and model loading on CUDA;
#   2. the GPU's measured peaks (copy bandwidth, matmul FLOP/s per dtype): chapter 00's roofline, and the
#      bandwidth step 3's MBU divides by;
#   3. the engine's goals: benchmarks/engine_vs_hf.py on CUDA (greedy identity and speed; decode auto =
#      cudagraph: the goal is a tiny-target step ≤ 0.5 ms on an H200), benchmarks/decode_mbu.py (a
#      random-weight Llama-3.2-1B shape in bf16 at batch 1, eager/fused/cudagraph: the goal is ≥ 60% of the
#      measured bandwidth), then the decode levers (tests/test_fast_decode.py: CUDA-graph replay == eager;
#      step_levers: eager/fused/cudagraph µs per step of tiny-target at batch 1); JSON into $OUT;
#   4. benchmarks/flash_attention_gpu.py, benchmarks/quant_kernels_gpu.py and benchmarks/flash_decoding_gpu.py
#      (JSON into $OUT), then benchmarks/serving_policies.py --quick on CUDA (continuous vs static batching,
#      sim vs real);
#   5. every notebook in full mode, run as a script (jupytext percent files are plain Python), each under
#      its own limit; the summary records "ran (N s)" or the failure, which gpu_collect.py stores.
# Every step's output goes to $OUT/<step>.log; a failed step does not stop the next one.
set -u
export OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
DEADLINE=${1:-520}
PART=${2:-all}
case "$PART" in all | kernels | engine | notebooks) ;; *)
    echo "part must be all, kernels, engine or notebooks, got '$PART'" >&2
    exit 2
    ;;
esac
START=$(date +%s)
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 MPLBACKEND=Agg HF_HUB_OFFLINE=1 PYTHONHASHSEED=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}
if [ -d .whl ]; then # wheels carried for what the image lacks (IPython for the notebooks)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
        export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

left() { echo $((DEADLINE - ($(date +%s) - START))); }

step() { # name limit_s command...
    local name=$1 limit=$2
    shift 2
    local budget
    budget=$(left)
    if [ "$budget" -lt 20 ]; then
        echo "== $name: skipped, $budget s left" | tee -a "$OUT/summary.txt"
        return
    fi
    [ "$limit" -gt "$budget" ] && limit=$budget
    local t0=$(date +%s)
    timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $(($(date +%s) - t0)) s (limit $limit s)" | tee -a "$OUT/summary.txt"
    tail -n 25 "$OUT/$name.log"
}

{
    nvidia-smi -L
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv
    $PY -c "import sys, torch, triton, transformers; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__); print(torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"

if [ "$PART" = all ] || [ "$PART" = kernels ]; then
    step tests 170 $PY -m pytest -q -p no:cacheprovider -o addopts= --timeout 90 --junitxml="$OUT/tests.xml" \
        tests/test_flash_attention.py tests/test_flash_decoding.py tests/test_paged.py tests/test_quant_matmul.py tests/test_prune.py \
        tests/test_intensity_kernel.py tests/test_transfer.py tests/test_hardware.py tests/test_models.py
fi
if [ "$PART" != notebooks ]; then
    step peaks 60 $PY -c "
import json, os
from course_lib.measure import microbench
p = microbench.measured_peaks('cuda', refresh=True)
print(p)
print(p.provenance)
import dataclasses
json.dump(dataclasses.asdict(p), open(os.environ['OUT'] + '/peaks.json', 'w'), indent=1)
    "
    # the engine's goals (issue 21): the step, the 1B shape's bandwidth, each lever, graph replay == eager
    step engine_vs_hf 45 $PY benchmarks/engine_vs_hf.py --device cuda --repeats 3 --json "$OUT/engine_vs_hf.json"
    step mbu 90 $PY benchmarks/decode_mbu.py --device cuda --shape llama-3.2-1b --dtype bf16 --levers eager fused cudagraph \
        --json "$OUT/decode_mbu.json"
    step levers 90 sh -c "$PY -m pytest -q -p no:cacheprovider -o addopts= --timeout 60 tests/test_fast_decode.py -k cudagraph \
        && $PY -m course_lib.bottlenecks.step_levers --device cuda --levers eager fused cudagraph --json $OUT/step_levers.json"
fi
if [ "$PART" = all ] || [ "$PART" = kernels ]; then
    step flash 100 $PY benchmarks/flash_attention_gpu.py --out "$OUT/flash_attention.json" --rep 40
    step quant 70 $PY benchmarks/quant_kernels_gpu.py --out "$OUT/quant_kernels.json" --rep 40
    step flash_decoding 40 $PY benchmarks/flash_decoding_gpu.py --out "$OUT/flash_decoding.json" --rep 20
    step serving 110 $PY benchmarks/serving_policies.py --quick --device cuda
fi
if [ "$PART" = all ] || [ "$PART" = notebooks ]; then
    export COURSE_MODE=full
    NB_LIMIT=${NB_LIMIT:-100}
    for nb in notebooks/[0-9][0-9]_*.py; do
        nb=$(basename "$nb" .py)
        step "nb_$nb" "$NB_LIMIT" $PY "notebooks/$nb.py"
    done
fi
echo "== total $(($(date +%s) - START)) s" | tee -a "$OUT/summary.txt"
