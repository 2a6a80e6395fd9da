"""Chapter 06's added measurements: chunked colocated baseline in the scale model, padded vs packed prefill,
priority admission, the llama.cpp side-by-side record, and their verdicts with counter-examples."""

import json

import numpy as np
import pytest

from course_lib.engine import Engine, SchedulerConfig
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.scheduler import Scheduler
from course_lib.engine.sequence import Sequence
from course_lib.measure.claims import claim
from course_lib.measure.metrics import SLO
from course_lib.serving import disagg, packing, priority
from course_lib.serving import llamacpp_server_record as lcs
from course_lib.serving.batching_plots import plot_bars
from course_lib.serving.simulator import CostModel

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = disagg.SimConfig(num_requests=60)


# ----------------------------------------------------------------------------- chunked colocated baseline
def test_chunked_colocated_spreads_the_prefill_stall():
    plain = disagg.simulate_colocated(CFG, 16.0, 2)
    chunked = disagg.simulate_colocated_chunked(CFG, 16.0, 2, 256)
    # a whole 2,048-token prefill stalls prefill-first decodes; chunks of 256 stall them far less
    assert np.percentile(chunked.max_itl, 99) < 0.5 * np.percentile(plain.max_itl, 99)
    assert np.all(chunked.ttft > 0) and np.all(chunked.tpot > 0)
    # a budget as large as the prompt prefills it in one step beside the decodes, like prefill-first
    whole = disagg.simulate_colocated_chunked(CFG, 16.0, 2, 4096)
    assert np.percentile(whole.max_itl, 99) > 2 * np.percentile(chunked.max_itl, 99)


def test_chunked_setup_in_sweep_and_bad_values():
    rows = disagg.sweep_rates(CFG, [8.0], setups=(("chunked", 2, 512),), slo=SLO(0.4, 0.009))
    assert rows[0]["setup"] == "colocated ×2, chunked 512"
    assert "colocated ×2, chunked 512" in disagg.side_by_side(rows, 8.0)
    with pytest.raises(ValueError, match="budget"):
        disagg.simulate_colocated_chunked(CFG, 8.0, 2, 0)
    with pytest.raises(ValueError, match="chunked"):
        disagg.sweep_rates(CFG, [8.0], setups=(("chunk", 2),))
    with pytest.raises(ValueError, match="rate must be one of"):
        disagg.side_by_side(rows, 3.0)


def test_disagg_verdict_against_chunked_fails_and_holds():
    statement = "disaggregation serves more goodput per GPU than colocated GPUs with chunked prefill"
    setups = (("chunked", 2, 256), (1, 1))
    names = ("disaggregated 1P+1D", "colocated ×2, chunked 256")
    # the chapter's SLO: chunked colocated GPUs keep TPOT low with two GPUs decoding → the claim fails
    rows = disagg.sweep_rates(CFG, [4.0, 8.0, 16.0], setups=setups, slo=SLO(0.4, 0.009))
    assert not claim(statement, disagg.goodput_margin(rows, *names), at_least=1e-6).held
    # a TTFT target below what chunking's extra steps allow: the split setup wins → the claim holds
    rows = disagg.sweep_rates(CFG, [4.0, 8.0, 16.0], setups=setups, slo=SLO(0.045, 0.05))
    assert claim(statement, disagg.goodput_margin(rows, *names), at_least=1e-6).held


def test_best_chunk_budget_is_one_of_the_candidates():
    b = disagg.best_chunk_budget(CFG, [16.0], 2, SLO(0.4, 0.009), budgets=(256, 4096))
    assert b == 256  # a whole-prompt budget is prefill-first again, and misses the TPOT target sooner
    with pytest.raises(ValueError, match="budgets"):
        disagg.best_chunk_budget(CFG, [16.0], 2, SLO(0.4, 0.009), budgets=())


# ----------------------------------------------------------------------------- padding and packing
def test_tokens_computed_per_layout():
    lens = [10, 3, 7, 2]
    assert packing.tokens_computed(lens, "padded") == 40
    assert packing.tokens_computed(lens, "bucketed", bucket_size=2) == 2 * 3 + 2 * 10
    assert packing.tokens_computed(lens, "packed") == 22
    with pytest.raises(ValueError, match="layout"):
        packing.tokens_computed(lens, "ragged")
    with pytest.raises(ValueError, match="lengths"):
        packing.tokens_computed([3, 0], "padded")


def test_time_layouts_runs_the_tokens_it_counts():
    eng = Engine("tiny-target", config=SchedulerConfig(max_num_seqs=8, max_model_len=256))
    prompts = [list(range(5, 5 + n)) for n in (60, 8, 30, 12)]
    res = packing.time_layouts(eng, prompts, pad_id=0, bucket_size=2, repeats=2)
    assert [res[k]["tokens"] for k in packing.LAYOUTS] == [240, 2 * 12 + 2 * 60, 110]
    assert all(res[k]["s"] > 0 for k in packing.LAYOUTS)
    with pytest.raises(ValueError, match="one step"):
        packing.time_layouts(Engine("tiny-target", config=SchedulerConfig(max_num_batched_tokens=64)), prompts, 0)


def test_packing_verdict_fails_when_time_ignores_the_tokens():
    statement = "packing saves at least half the time its token count predicts"
    follows = {"padded": {"tokens": 200, "s": 2.0}, "packed": {"tokens": 100, "s": 1.0}}
    assert claim(statement, packing.saved_share(follows), at_least=0.5).held
    flat = {"padded": {"tokens": 200, "s": 1.1}, "packed": {"tokens": 100, "s": 1.0}}  # fixed cost dominates
    assert not claim(statement, packing.saved_share(flat), at_least=0.5).held
    with pytest.raises(ValueError, match="no padding"):
        packing.saved_share({"padded": {"tokens": 10, "s": 1.0}, "packed": {"tokens": 10, "s": 1.0}})


# ----------------------------------------------------------------------------- priority admission
class _NoKV:
    stores_kv = False

    def can_allocate(self, n):
        return True

    def allocate(self):
        return None

    def append(self, handle, n):
        pass


def test_priority_admission_orders_the_queue_and_keeps_fcfs_within_a_class():
    sched = Scheduler(SchedulerConfig(max_num_seqs=2, admission="priority"), _NoKV())
    seqs = [Sequence(i, [1, 2, 3], SamplingParams(max_new_tokens=1), float(i)) for i in range(4)]
    for s, q in zip(seqs, (1, 1, 0, 0)):
        s.priority = q
        sched.add(s)
    assert [s.request_id for s in sched.schedule(now=10.0).seqs] == [2, 3]
    fcfs = Scheduler(SchedulerConfig(max_num_seqs=2), _NoKV())
    for s in [Sequence(i, [1, 2, 3], SamplingParams(max_new_tokens=1), float(i)) for i in range(4)]:
        s.priority = 1 - s.request_id % 2
        fcfs.add(s)
    assert [s.request_id for s in fcfs.schedule(now=10.0).seqs] == [0, 1]
    with pytest.raises(ValueError, match="admission"):
        SchedulerConfig(admission="edf")


COST = CostModel(a=0.007, b=0.00016, c=0.0, d=0.0, meta={"max_model_len": 1024, "kv_layout": (6, 2, 32)})


def test_priority_verdict_fails_without_a_queue():
    statement = "priority admission lifts the interactive class's TTFT-SLO attainment ≥ 1.5× over FCFS"
    cfg = SchedulerConfig(max_num_seqs=8, max_model_len=512)
    for slow in (1.0, 3.0):  # the same verdict on a machine three times slower: the load scales with the cost
        cost = CostModel(a=COST.a * slow, b=COST.b * slow, c=0.0, d=0.0, meta=COST.meta)
        rate, slo = priority.load_for(cost, 8, load=1.0)
        loaded = priority.compare_admission(*priority.mixed_trace(60, rate=rate), cfg, cost, slo)
        assert claim(statement, priority.attainment_lift(loaded), at_least=1.5).held
        assert loaded["priority"]["batch"]["ttft_p50"] >= loaded["fcfs"]["batch"]["ttft_p50"]  # the batch class pays
        rate, slo = priority.load_for(cost, 8, load=0.3)  # no queue: the order of admission changes nothing
        idle = priority.compare_admission(*priority.mixed_trace(30, rate=rate), cfg, cost, slo)
        assert not claim(statement, priority.attainment_lift(idle), at_least=1.5).held
    assert priority.plot_admission(loaded, slo).axes
    with pytest.raises(ValueError, match="slots"):
        priority.load_for(COST, 0)


def test_priorities_are_checked():
    trace, prios = priority.mixed_trace(10, rate=5.0)
    from course_lib.serving.simulator import simulate

    with pytest.raises(ValueError, match="priorities"):
        simulate(trace, SchedulerConfig(max_num_seqs=4, max_model_len=512), COST, priorities=prios[:-1])
    with pytest.raises(ValueError, match="interactive_share"):
        priority.mixed_trace(10, interactive_share=1.0)


# ----------------------------------------------------------------------------- llama.cpp side by side, plots
def test_recorded_side_by_side_has_its_provenance():
    rec = lcs.load_record()
    assert {r["server"] for r in rec["rows"]} == set(lcs.SERVERS)
    assert lcs.COMMAND in rec["command"] and rec["versions"]["llama-cpp-python"]
    assert len(rec["load_average_before"]) == 3
    rates = {r["rate"] for r in rec["rows"]}
    for which in lcs.SERVERS:  # the same rates for both servers
        assert {r["rate"] for r in rec["rows"] if r["server"] == which} == rates
    table = lcs.side_by_side(rec)
    assert "llama.cpp server" in table and "course server" in table
    assert lcs.plot_side_by_side(rec).axes


def test_load_record_refuses_a_file_without_provenance(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="re-record"):
        lcs.load_record(p)
    with pytest.raises(ValueError, match="which"):
        lcs.server_command("vllm", 8000, 1, "x.gguf")


def test_plot_bars_checks_its_values():
    ax = plot_bars({"a": 1.0, "b": 2.0}, "ms", "t", spread={"a": 0.1})
    assert len(ax.patches) == 2
    with pytest.raises(ValueError, match="values"):
        plot_bars({}, "ms", "t")


def test_server_cli_refuses_bad_sizes(capsys):
    from course_lib.serving.server.__main__ import main

    with pytest.raises(SystemExit):
        main(["--max-num-seqs", "0"])
    assert "--max-num-seqs must be >= 1" in capsys.readouterr().err
