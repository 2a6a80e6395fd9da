"""The layer draft with a truncated-vocabulary head (engine.speculative.layer_draft): the head's mapping,
greedy identity under speculation on awkward prompts, bad input, and the shipped SmolLM2 draft."""

import pytest
import torch

from course_lib.core.paths import data_dir
from course_lib.decoding.layer_draft_train import draft_vocab, soft_ce
from course_lib.engine import Engine, SamplingParams, SchedulerConfig
from course_lib.engine.speculative import DraftProposer, SpeculativeDecoder, TruncatedHead, load_layer_draft
from course_lib.engine.speculative.layer_draft import build_hf_draft, layer_draft_engine

pytestmark = pytest.mark.usefixtures("one_thread")  # target: the conftest fixture
SHIPPED = data_dir() / "models" / "smollm2-135m-draft"


def test_truncated_head_maps_back_to_target_ids():
    torch.manual_seed(0)
    V, D = 50, 8
    full = torch.randn(V, D)
    ids = torch.tensor([3, 7, 11, 40])
    head = TruncatedHead(full[ids], ids, V)
    x = torch.randn(5, D)
    out = head(x)  # (5, V)
    assert out.shape == (5, V)
    torch.testing.assert_close(out[:, ids], x @ full[ids].T)
    outside = torch.ones(V, dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(out[:, outside]).all()
    expected = ids[(x @ full[ids].T).argmax(-1)]  # the argmax over the N rows, as a target id
    assert torch.equal(out.argmax(-1), expected)


@pytest.mark.parametrize(
    "weight, ids, match",
    [
        (torch.zeros(3), torch.tensor([0, 1, 2]), "weight must be a 2-D"),
        (torch.zeros(3, 4), torch.tensor([0, 1]), "ids must be a 1-D tensor of 3"),
        (torch.zeros(2, 4), torch.tensor([0, 50]), r"ids must lie in \[0, 50\)"),
        (torch.zeros(2, 4), torch.tensor([-1, 2]), r"ids must lie in \[0, 50\)"),
        (torch.zeros(2, 4), torch.tensor([5, 5]), "distinct"),
    ],
)
def test_truncated_head_bad_input(weight, ids, match):
    with pytest.raises(ValueError, match=match):
        TruncatedHead(weight, ids, 50)


@pytest.fixture(scope="module")
def tiny_layer_draft(target):
    """A 1-layer draft of tiny-target over its 256 most used ids (a trained head is not needed for identity)."""
    torch.manual_seed(0)
    hf = build_hf_draft(target.hf_model, [0])
    ids = torch.arange(0, target.model.vocab_size, 16)  # every 16th id: many target tokens are outside
    head_w = target.hf_model.lm_head.weight.detach()[ids].clone()
    return layer_draft_engine(target, hf, head_w, ids), ids


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_identity_with_layer_draft_on_awkward_prompts(target, tiny_layer_draft, gamma):
    draft, ids = tiny_layer_draft
    gen = torch.Generator().manual_seed(1)
    V = target.model.vocab_size
    outside = [t for t in range(V) if t % 16][:3]  # ids the draft's head can never propose
    prompts = [
        [5],  # one token
        torch.randint(0, V, (40,), generator=gen).tolist(),  # random ids
        outside * 4,  # only tokens outside the draft's vocabulary
        target.encode(["def f(x):\n    return x\n\n\ndef g(x):"])[0],
    ]
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    plain = [r.output_ids for r in target.generate(prompts, params)]
    proposer = DraftProposer(draft)
    res = SpeculativeDecoder(target, proposer, gamma).generate(prompts, params)
    assert [r.output_ids for r in res] == plain
    assert res.stats.proposed > 0
    allowed = set(ids.tolist())
    assert set(proposer.propose(prompts[1], 6)) <= allowed  # drafts are always ids of the truncated vocabulary


def test_layer_draft_shares_the_embedding(target, tiny_layer_draft):
    draft, _ = tiny_layer_draft
    assert draft.model.embed_weight.data_ptr() == target.model.embed_weight.data_ptr()
    assert draft.model.vocab_size == target.model.vocab_size
    assert draft.model.num_layers == 1


def test_layer_draft_bad_input(target, tmp_path):
    with pytest.raises(ValueError, match="target must be an Engine"):
        load_layer_draft("smollm2-135m-instruct")
    with pytest.raises(ValueError, match="no layer draft at"):
        load_layer_draft(target, tmp_path)
    with pytest.raises(ValueError, match="layers must be a non-empty list"):
        build_hf_draft(target.hf_model, [])
    with pytest.raises(ValueError, match="layers must be a non-empty list"):
        build_hf_draft(target.hf_model, [target.model.num_layers])


def test_soft_ce_and_vocab():
    pos = torch.full((10,), -1, dtype=torch.long)
    kept = torch.tensor([2, 5, 7])
    pos[kept] = torch.arange(3)
    logits = torch.randn(4, 3)
    t_ids = torch.tensor([[5, 1], [2, 9], [7, 5], [2, 7]])
    t_p = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.5, 0.5], [0.25, 0.75]])
    # a one-hot teacher inside the vocabulary is the plain cross-entropy; mass outside it is dropped
    want = (
        -(
            logits.log_softmax(-1)[0, 1]
            + logits.log_softmax(-1)[1, 0]
            + 0.5 * logits.log_softmax(-1)[2, 2]
            + 0.5 * logits.log_softmax(-1)[2, 1]
            + 0.25 * logits.log_softmax(-1)[3, 0]
            + 0.75 * logits.log_softmax(-1)[3, 2]
        )
        / 4
    )
    torch.testing.assert_close(soft_ce(logits, t_ids, t_p, pos), want)
    teacher = [(torch.tensor([[4], [4], [6]]), None)]
    vocab = draft_vocab(teacher, [[1, 1, 3]], 3, 10)
    assert vocab.tolist() == [1, 4, 6]  # the teacher's argmax first, then the inputs by count
    assert draft_vocab(teacher, [[1, 1, 3]], 6, 10).tolist() == [0, 1, 2, 3, 4, 6]  # then the lowest ids
    with pytest.raises(ValueError, match="n must be in"):
        draft_vocab(teacher, [[1]], 11, 10)


@pytest.mark.skipif(not SHIPPED.is_dir(), reason="the SmolLM2 draft is not in data/models")
def test_shipped_smollm2_draft_is_exact(smollm2_cache):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COURSE_CACHE_DIR", str(smollm2_cache))
        smol = Engine("smollm2-135m-instruct", config=SchedulerConfig(max_model_len=256, max_num_seqs=4))
    draft = load_layer_draft(smol, SHIPPED)
    assert draft.model.embed_weight.data_ptr() == smol.model.embed_weight.data_ptr()
    tok = smol.tokenizer
    chat = tok.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True)
    chat = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
    prompts = [chat, [42], torch.randint(0, 49152, (12,), generator=torch.Generator().manual_seed(0)).tolist()]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    plain = [r.output_ids for r in smol.generate(prompts, params)]
    res = SpeculativeDecoder(smol, DraftProposer(draft), 3).generate(prompts, params)
    assert [r.output_ids for r in res] == plain


def test_draft_cost(target):
    from course_lib.decoding.draft_cost import alpha_needed, draft_bytes
    from course_lib.engine.speculative import expected_speedup

    m = target.model
    b = draft_bytes(target, m.num_layers, m.vocab_size)
    n_params = sum(p.numel() for p in target.hf_model.parameters())  # tied: the embedding counted once
    assert b.target == n_params * 4
    assert b.draft == b.target  # all layers + the whole head is the target itself
    assert draft_bytes(target, 1, 16).c_bytes < b.head_share
    a = alpha_needed(1.5, 0.1)
    assert expected_speedup(a, 4, 0.1) <= max(expected_speedup(a, g, 0.1) for g in range(1, 17))
    assert (
        max(expected_speedup(a - 0.001, g, 0.1) for g in range(1, 17))
        < 1.5
        <= max(expected_speedup(a, g, 0.1) for g in range(1, 17))
    )
    assert alpha_needed(1.0, 0.0) == 0.0  # a free proposer that never hits: exactly plain speed
    assert alpha_needed(20.0, 0.1) != alpha_needed(20.0, 0.1)  # nan: out of reach
    with pytest.raises(ValueError, match="layers must be an int"):
        draft_bytes(target, 0, 16)
    with pytest.raises(ValueError, match="goal must be a speed-up"):
        alpha_needed(0.5, 0.1)
