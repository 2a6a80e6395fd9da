"""``transformers``' own speculative decoding (assisted generation) on the same models and prompt as ours.

A baseline a practitioner would use, at its defaults (read from the installed version: ``assistant_defaults``)
and at our γ with its schedule held constant (like with like): its plain ``generate`` and its assisted one,
timed the same way as ours, and whether its greedy tokens equal our engine's. Each framework is judged by
its speed-up over its *own* plain loop: comparing our speculative time with its assisted time would measure
the two loops, not speculation. Also ``quiet``, which
silences ``transformers``' notices for one call. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import copy

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


ASSISTANT_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def assistant_defaults(draft_hf) -> dict:
    """The settings ``transformers`` uses for ``draft_hf`` as an assistant: its generation config over the
    library's global defaults, read from the installed version (5.24: 20 drafts per step, a "constant"
    schedule, and drafting stops early once the draft's top probability falls below 0.4)."""
    gc = copy.deepcopy(draft_hf.generation_config)
    gc.update(**gc._get_default_generation_params(), defaults_only=True)
    return {k: getattr(gc, k) for k in ASSISTANT_KEYS}


@torch.inference_mode()
def hf_assisted(target, draft, base: Baseline, repeats: int = 3, gamma: int | None = None) -> dict:
    """``transformers``' own assisted generation (its speculative decoding) on the same models and the first
    prompt of ``base``: its plain ``generate``, assisted at its defaults, and (``gamma``) assisted at our
    γ with a constant schedule and no confidence stop, like ours. Each framework's speed-up is over its own
    plain loop; whether its tokens equal our greedy output is checked for both settings."""
    if gamma is not None and (not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1):
        raise ValueError(f"gamma must be None or an int ≥ 1, got {gamma!r}")
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
    defaults = assistant_defaults(hf_d)

    def assisted(**settings):
        saved = {k: getattr(hf_d.generation_config, k, None) for k in ASSISTANT_KEYS}
        for k, v in settings.items():
            setattr(hf_d.generation_config, k, v)
        try:
            tokens = hf_t.generate(x, assistant_model=hf_d, **kw)[0, len(ids) :].tolist()
            return tokens, best_of(lambda: hf_t.generate(x, assistant_model=hf_d, **kw), repeats)
        finally:
            for k, v in saved.items():
                setattr(hf_d.generation_config, k, v)

    def measure():  # its notices about generation_config defaults are not for the learner
        hf_t.generate(x, **kw)  # warm-up
        plain = best_of(lambda: hf_t.generate(x, **kw), repeats)
        out = {"plain_s": plain, "defaults": defaults}
        out["default_tokens"], out["assisted_s"] = assisted()
        if gamma is not None:
            same = dict(
                num_assistant_tokens=gamma, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0
            )
            out["same_gamma_tokens"], out["same_gamma_s"] = assisted(**same)
        return out

    out = quiet(measure)
    out["identical"] = out.pop("default_tokens") == base.outputs[0]
    if gamma is not None:
        out["same_gamma_identical"] = out.pop("same_gamma_tokens") == base.outputs[0]
    out["gamma"] = gamma
    return out
