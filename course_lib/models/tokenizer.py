"""A byte-level BPE tokenizer trained on the course corpus with the `tokenizers` library, and the
corpus's splits as token ids.

Byte-level means any string round-trips (no unknown token); BPE merges frequent byte pairs, so
common code fragments ("self.", "    def", "return") become single tokens. Saved as a
``transformers`` fast tokenizer so ``AutoTokenizer.from_pretrained(path)`` loads it; ``token_ids``
tokenizes a whole split once and caches it on disk for training and evaluation.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from course_lib.models.corpus import EOS, cache_dir, corpus_text

PAD = "<|pad|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2):
    """Train a byte-level BPE of ``vocab_size`` tokens (incl. 2 special ones) and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not isinstance(vocab_size, int) or vocab_size < 258 + 2:
        raise ValueError(f"vocab_size must be an int >= 260 (256 bytes + specials + merges), got {vocab_size!r}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_tokenizer(path: str | Path):
    """The tokenizer saved in folder ``path`` (FileNotFoundError naming the files it lacks)."""
    from transformers import AutoTokenizer

    path = Path(path)
    missing = [f for f in TOKENIZER_FILES if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"tokenizer folder {path} is missing {missing}")
    return AutoTokenizer.from_pretrained(str(path))


def build_tokenizer(out: Path, vocab_size: int = 4096):
    """Train the course tokenizer on the corpus's train split and save it to folder ``out``."""
    text = corpus_text("train")
    chunks = text.split("\n<|endoftext|>\n")
    tok = train_tokenizer(chunks, vocab_size=vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    return tok


def token_ids(tokenizer, split: str) -> np.ndarray:
    """The whole split as one uint16 array of token ids (files joined by EOS), cached on disk."""
    tok_hash = hashlib.sha1(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:10]
    path = cache_dir() / f"tokens-{sys.version_info.major}{sys.version_info.minor}-{tok_hash}-{split}.npy"
    if path.exists():
        return np.load(path)
    text = corpus_text(split)
    files = text.split("\n<|endoftext|>\n")
    ids: list[int] = []
    eos = tokenizer.eos_token_id
    for piece, enc in zip(files, tokenizer(files, add_special_tokens=False)["input_ids"]):
        ids.extend(enc)
        ids.append(eos)
    if len(tokenizer) > 65535:
        raise ValueError("vocabulary too large for uint16 token cache")
    arr = np.asarray(ids, dtype=np.uint16)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, arr)
    return arr
