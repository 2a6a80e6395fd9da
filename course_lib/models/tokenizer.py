"""A byte-level BPE tokenizer trained on the course corpus with the `tokenizers` library.

Byte-level means any string round-trips (no unknown token); BPE merges frequent byte pairs, so
common code fragments ("self.", "    def", "return") become single tokens. Saved as a
``transformers`` fast tokenizer so ``AutoTokenizer.from_pretrained(path)`` loads it.
"""

from __future__ import annotations

from collections.abc import Iterable

from course_lib.models.corpus import EOS

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
