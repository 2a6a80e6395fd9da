"""serving.chat_model: the chat model's engine with a small KV cache, its chat template, one timed answer."""

import statistics

import pytest

from course_lib.serving import chat_model

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def chat(smollm2_cache):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COURSE_CACHE_DIR", str(smollm2_cache))
        yield chat_model.chat_engine(max_model_len=256, max_num_seqs=2)


def test_the_engine_reserves_a_small_cache(chat):
    assert (chat.config.max_model_len, chat.config.max_num_seqs) == (256, 2)
    assert chat.config.max_num_batched_tokens >= 256  # a whole prompt in one step


def test_chat_ids_are_the_template_the_tokenizer_applies(chat):
    ids = chat_model.chat_ids(chat.tokenizer, QUESTION)
    messages = [{"role": "user", "content": QUESTION}]
    ref = chat.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids == list(ref)
    text = chat.tokenizer.decode(ids)
    assert QUESTION in text and text.endswith("<|im_start|>assistant\n")
    with_system = chat.tokenizer.decode(chat_model.chat_ids(chat.tokenizer, QUESTION, system="Answer in one word."))
    assert "Answer in one word." in with_system and "named SmolLM" in text and "named SmolLM" not in with_system


def test_a_chat_answer_talks_and_keeps_every_gap(chat):
    ans = chat_model.chat_answer(chat, QUESTION, max_new_tokens=24)
    assert "Paris" in ans.text and ans.finish_reason == "eos"
    tr = ans.trace
    assert tr.n_output == len(ans.output_ids) and len(tr.itl) == tr.n_output - 1
    assert statistics.fmean(tr.itl) == pytest.approx(tr.tpot)  # TPOT is the mean inter-token latency
    p = ans.itl_percentiles
    assert list(p) == [50, 90, 99] and p[50] <= p[90] <= p[99] <= max(tr.itl)


def test_a_capped_answer_stops_at_the_length(chat):
    ans = chat_model.chat_answer(chat, "Write a long story about a dragon.", max_new_tokens=5)
    assert len(ans.output_ids) == 5 and ans.finish_reason == "length"


def test_bad_input_is_named(chat):
    with pytest.raises(ValueError, match="message"):
        chat_model.chat_ids(chat.tokenizer, "  ")
    with pytest.raises(ValueError, match="system"):
        chat_model.chat_ids(chat.tokenizer, QUESTION, system=3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        chat_model.chat_answer(chat, QUESTION, max_new_tokens=0)
    with pytest.raises(ValueError, match="max_model_len"):
        chat_model.chat_engine(max_model_len=1)
    with pytest.raises(ValueError, match="max_num_seqs"):
        chat_model.chat_engine(max_num_seqs=0)


def test_a_tokenizer_without_a_chat_template_is_refused():
    from course_lib.models.load import load_model

    _, tok = load_model("tiny-target")
    if getattr(tok, "chat_template", None) is not None:
        pytest.skip("the tiny tokenizer has a chat template")
    with pytest.raises(ValueError, match="chat template"):
        chat_model.chat_ids(tok, QUESTION)
