import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    from course_lib.models.train import load_tokenizer
    from course_lib.paths import data_dir

    return load_tokenizer(data_dir() / "models" / "tokenizer")


def random_llama(tokenizer=None, vocab: int = 101, kind: str = "llama", seed: int = 0, layers: int = 2):
    """A randomly initialised tiny decoder with GQA (4 query heads, 2 KV heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    ids = {}
    if tokenizer is not None:
        vocab = len(tokenizer)
        ids = dict(
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        **ids,
    )
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common)).eval()
    return LlamaForCausalLM(LlamaConfig(**common)).eval()
