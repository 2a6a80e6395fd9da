"""``transformers``' own speculative decoding (assisted generation) on the same models and prompt as ours.

A baseline a practitioner would use, at its defaults: its plain ``generate`` and its assisted one,
timed the same way as ours, and whether its greedy tokens equal our engine's. Also ``quiet``, which
silences ``transformers``' notices for one call. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.decoding.speedup import Baseline, best_of


def quiet(fn, *args, **kwargs):
    """Call ``fn`` with ``transformers``' warnings off (e.g. "sequence longer than the model's maximum" when
    tokenizing a whole file that is then cut into windows, or notices about generation_config defaults)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return fn(*args, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)


@torch.inference_mode()
def hf_assisted(target, draft, base: Baseline, repeats: int = 3) -> dict:
    """``transformers``' own assisted generation (its speculative decoding) on the same models and the first
    prompt of ``base``: its plain and assisted times, and whether its tokens equal our greedy output."""
    hf_t, hf_d = target.hf_model, draft.hf_model
    ids = base.ids[0]
    new = base.params.max_new_tokens
    x = torch.tensor([ids], device=target.device)
    kw = dict(
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        pad_token_id=target.tokenizer.pad_token_id,
        attention_mask=torch.ones_like(x),
    )

    def measure():  # its notices about generation_config defaults are not for the learner
        hf_t.generate(x, **kw)  # warm-up
        plain = best_of(lambda: hf_t.generate(x, **kw), repeats)
        tokens = hf_t.generate(x, assistant_model=hf_d, **kw)[0, len(ids) :].tolist()
        assisted = best_of(lambda: hf_t.generate(x, assistant_model=hf_d, **kw), repeats)
        return plain, tokens, assisted

    plain, tokens, assisted = quiet(measure)
    return dict(plain_s=plain, assisted_s=assisted, identical=tokens == base.outputs[0])
