"""Vocabulary-parallel embedding and head (tp_vocab), and the rank load without transformers (tp_standalone)."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.parallel import tp_standalone, tp_vocab


class _Stub:
    """A Comm stand-in for one process playing every rank: all_reduce is the identity (the test sums the
    ranks), all_gather_tokens returns the parts the test prepared."""

    def __init__(self, world_size=1, parts=None):
        self.world_size, self.parts = world_size, parts

    def all_reduce(self, x):
        return x

    def all_gather_tokens(self, x):
        return torch.cat(self.parts)


def test_vocab_parallel_embedding_and_head_equal_the_whole_tables():
    torch.manual_seed(0)
    V, D, p = 12, 5, 3
    table = torch.randn(V, D)
    ids = torch.tensor([0, 3, 4, 7, 8, 11, 5])
    parts = []
    for r in range(p):
        a, b = tp_vocab.vocab_range(V, r, p)
        parts.append(tp_vocab.VocabParallelEmbedding(table[a:b], a, V, _Stub())(ids))
    torch.testing.assert_close(sum(parts), F.embedding(ids, table), rtol=0, atol=0)  # exact: zeros elsewhere
    # each token's row comes from exactly one rank
    assert all(
        int((part.abs().sum(-1) > 0).sum()) == int(((ids >= r * 4) & (ids < r * 4 + 4)).sum())
        for r, part in enumerate(parts)
    )
    x = torch.randn(4, D)
    local = [x @ table[r * 4 : (r + 1) * 4].T for r in range(p)]  # (N, V/p) per rank
    head = tp_vocab.VocabParallelHead(table[0:4], _Stub(p, local))
    torch.testing.assert_close(head(x), x @ table.T)
    # counter-example: gathering the ranks in the wrong order puts the logits under the wrong ids
    wrong = tp_vocab.VocabParallelHead(table[0:4], _Stub(p, local[::-1]))
    assert not torch.allclose(wrong(x), x @ table.T)
    with pytest.raises(ValueError, match="vocab_size=10 cannot be split"):
        tp_vocab.vocab_range(10, 0, 3)
    with pytest.raises(ValueError, match="rank must be"):
        tp_vocab.vocab_range(12, 3, 3)


@pytest.mark.parametrize("name", ["tiny-target", "smollm2-135m-instruct"])
def test_standalone_rope_frequencies_match_transformers(name):
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from course_lib.parallel.tp_load import checkpoint_folder

    try:
        folder = checkpoint_folder(name)
    except FileNotFoundError:
        pytest.skip(f"{name} is not converted on this machine")
    cfg = tp_standalone.read_config(folder)
    assert tp_standalone.rope_type(cfg) == "default"
    hf = LlamaRotaryEmbedding(config=AutoConfig.from_pretrained(str(folder)))
    torch.testing.assert_close(tp_standalone.default_inv_freq(cfg), hf.inv_freq.float())
    assert hf.attention_scaling == 1.0


def test_tp2_vocab_parallel_equals_one_process_and_holds_half_the_vocabulary():
    from course_lib.parallel.tp_equal import tp_equality

    prompts = torch.randint(0, 4096, (3, 12), generator=torch.Generator().manual_seed(0)).tolist()
    res = tp_equality("tiny-target", 2, prompts, vocab_parallel=True, max_new_tokens=6)
    assert res.logits_close(1e-5, rtol=2e-6), res.max_abs_diff  # reordered fp32 sums: a few ulps of max|logit|
    assert res.greedy_equal and res.argmax_equal
    assert [r["vocab_rows"] for r in res.ranks] == [2048, 2048] and res.single["vocab_rows"] == 4096
    one_table = 4096 * 256 * 4  # tied: the embedding and the head are one (V, D) fp32 table
    # per rank: the layers' 1/2 plus half the table, against the replicated layout's whole table
    layers = res.single["weight_bytes"] - one_table
    for r in res.ranks:
        assert r["weight_bytes"] == pytest.approx(layers / 2 + one_table / 2, rel=0.01)
        assert not r["transformers_imported"]  # the ranks read safetensors and config.json only
    # counter-example for the saving check: the replicated ranks hold the whole table
    assert not all(r["weight_bytes"] == pytest.approx(layers / 2 + one_table, rel=0.01) for r in res.ranks)


def test_recorded_layouts_and_the_saving_verdict(tmp_path):
    import json

    from course_lib.measure.claims import claim
    from course_lib.parallel import tp_record

    raw = json.loads(tp_record.record_path().read_text(encoding="utf-8"))
    got = tp_record.load_layouts()
    assert tp_record.MAIN in got and list(got) == [n for n in tp_record.LAYOUTS if n in got]
    old = tmp_path / "old.json"  # a file from before the layouts: only the chapter's run
    old.write_text(json.dumps({k: v for k, v in raw.items() if k != "layouts"}), encoding="utf-8")
    assert list(tp_record.load_layouts(old)) == [tp_record.MAIN]
    emb = 49152 * 576 * 4
    # the notebook's verdict: a replicated run saves nothing, so it fails
    assert claim("saves (p-1)/p of the table", 0 / (emb * 2 / 3), at_least=0.99, at_most=1.01).held is False
    assert claim("saves (p-1)/p of the table", (emb * 2 / 3) / (emb * 2 / 3), at_least=0.99, at_most=1.01).held


def test_sequence_parallel_with_vocab_parallel_is_refused_before_any_work():
    from course_lib.parallel.tp_model import tp_engine

    with pytest.raises(ValueError, match="sequence_parallel=True with vocab_parallel=True"):
        tp_engine(0, 2, "tiny-target", sequence_parallel=True, vocab_parallel=True)
