import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib.core.memory import freeze_imports  # noqa: E402

# torch's and transformers' ~360k objects out of every later collection: each Engine() runs trim_heap, and a
# full collection over them costs ~0.2 s (core.memory.freeze_imports)
freeze_imports()


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's engine runs (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    steady on a shared 2-core machine, restored afterwards."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def target():
    """The embedded tiny-target in an Engine, one per module."""
    from course_lib.engine import Engine

    return Engine("tiny-target")


def flat_step(m, backend, handles, chunks):
    """Append each chunk to its sequence's storage and run them as one flat forward; logits of every token."""
    starts = []
    for h, c in zip(handles, chunks):
        starts.append(backend.length(h))
        backend.append(h, len(c))
    ids = torch.tensor([t for c in chunks for t in c])
    pos = torch.tensor([p for s, c in zip(starts, chunks) for p in range(s, s + len(c))])
    meta = backend.prepare(handles, [len(c) for c in chunks], pos)
    return m(ids, pos, meta, backend)  # (N, V)


@pytest.fixture(scope="session")
def tokenizer():
    from course_lib.core.paths import data_dir
    from course_lib.models.tokenizer import load_tokenizer

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


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """A course cache folder holding smollm2-135m-instruct, converted once per test session from the installed
    package (~20 s); set ``COURSE_CACHE_DIR`` to it and ``load_model`` reads it. Skips without the package."""
    from course_lib.models import gguf

    name = "smollm2-135m-instruct"
    try:
        gguf.gguf_file(name)
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("course-cache")
    gguf.convert(name, root / "models" / name)
    return root
