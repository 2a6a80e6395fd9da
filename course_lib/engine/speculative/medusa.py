"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads"): K small heads on the target's last hidden state guess the tokens 2..K+1 steps ahead.

No draft model, no second KV cache: head k (1-based) reads the hidden state h_t that the target already
computed at position t (the one whose base LM head produces token t+1) and predicts token t+1+k. Each
head is a Medusa-1 block on the target's final RMSNorm: ``z = norm(h); z + SiLU(W z + b)`` then its own
linear to the vocabulary, initialised from the target's LM head with W = b = 0 (so an untrained head is
exactly the base head). The heads are trained on the *frozen* target (``course_lib.decoding.medusa_train``).

Decoding plugs into ``SpeculativeDecoder``: ``MedusaProposer`` keeps, per row, the hidden state at the
position that produced the pending token (``Verified.hidden[accepted]``) and proposes the heads' top-1
tokens as γ = K deterministic drafts. Drafts are one-hot (q = None), which the decoder's rejection rule
already handles, so greedy output is token-identical and sampled output follows the target's
distribution. ``medusa_tree.MedusaTreeDecoder`` (batch 1, greedy) verifies a *tree* of candidates.

Cost. On a big model the heads are ~free: a D×V projection per head next to billions of weights. Our
target is tiny (5M parameters, V = 4096, D = 256), so one head's D×V + D² is ~1.1M weights, ~22% of a
target forward's weight reads: the cost ratio c is not negligible here (``decoding.medusa_speed``
measures it). Decode stays bandwidth-bound; a verify over K+1 positions reads the weights once.

    heads = load_medusa("tiny-target-medusa", target)
    SpeculativeDecoder(target, MedusaProposer(heads, target), gamma=heads.num_heads).generate(prompts)

Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib.engine.engine import Engine
from course_lib.engine.model import rms_norm
from course_lib.engine.speculative.proposer import Proposal, Proposer, Verified
from course_lib.engine.speculative.verifier import SpeculativeDecoder

WEIGHTS_FILE = "medusa.safetensors"
EMBEDDED_NAME = "tiny-target-medusa"
_PROBE = 16  # LM-head values stored in the fingerprint


# ---------------------------------------------------------------------------------------------- the heads


def positive_int(name: str, value) -> int:
    """``value`` if it is an int ≥ 1, else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int ≥ 1, got {value!r}")
    return value


def check_engine(target, name: str = "target") -> Engine:
    """``target`` if it is an ``Engine``, else a ValueError naming ``name``."""
    if not isinstance(target, Engine):
        raise ValueError(f"{name} must be an Engine (e.g. Engine('tiny-target')), got {type(target).__name__}")
    return target


def target_fingerprint(target: Engine) -> dict:
    """What identifies the target the heads were trained on: shape, plus a probe of LM-head values (kept as
    numbers, compared with a tolerance, so the same target loaded in fp16/bf16 still matches)."""
    check_engine(target)
    m = target.model
    w = target.hf_model.get_output_embeddings().weight.detach()  # (V, D), the original even if quantized later
    idx = torch.linspace(0, w.numel() - 1, _PROBE).long()
    return {
        "hidden_size": int(m.config.hidden_size),
        "vocab_size": int(m.vocab_size),
        "num_layers": int(m.num_layers),
        "lm_head_probe": [round(float(v), 6) for v in w.float().flatten()[idx]],
    }


def fingerprint_mismatch(expected: dict, actual: dict) -> str | None:
    """None when two fingerprints describe the same target, else what differs."""
    for key in ("hidden_size", "vocab_size", "num_layers"):
        if expected.get(key) != actual.get(key):
            return f"{key} {expected.get(key)} (heads) vs {actual.get(key)} (target)"
    a = torch.tensor(expected.get("lm_head_probe", []), dtype=torch.float64)
    b = torch.tensor(actual.get("lm_head_probe", []), dtype=torch.float64)
    if a.shape != b.shape or not torch.allclose(a, b, rtol=1e-2, atol=1e-3):
        return "LM-head weights differ"
    return None


class MedusaHeads(torch.nn.Module):
    """K Medusa-1 heads for one target. ``forward(hidden (..., D))`` → logits (K, ..., V); head k (index
    k-1) predicts the token k+1 positions after the one the base head predicts."""

    def __init__(self, target: Engine, num_heads: int = 4) -> None:
        super().__init__()
        check_engine(target)
        positive_int("num_heads", num_heads)
        m = target.model
        D, V = int(m.config.hidden_size), int(m.vocab_size)
        lm = target.hf_model.get_output_embeddings().weight.detach().float()  # (V, D)
        self.num_heads, self.hidden_size, self.vocab_size, self.eps = num_heads, D, V, float(m.eps)
        self.fingerprint = target_fingerprint(target)
        self.register_buffer("final_norm", m.final_norm.detach().float().clone())  # (D,) frozen, as the base head
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(D, D) for _ in range(num_heads))
        self.lm = torch.nn.ModuleList(torch.nn.Linear(D, V, bias=False) for _ in range(num_heads))
        with torch.no_grad():
            for block, lm_k in zip(self.blocks, self.lm):
                block.weight.zero_()  # Medusa zeroes W so the head starts as the base head;
                block.bias.zero_()  # we zero the bias too, so that holds exactly
                lm_k.weight.copy_(lm)  # each head its own trainable copy of the LM head
        self.to(m.device)

    def check_target(self, target: Engine) -> None:
        """Refuse a target other than the one these heads were trained for."""
        why = fingerprint_mismatch(self.fingerprint, target_fingerprint(target))
        if why is not None:
            raise ValueError(f"Medusa heads trained for another model: {why}; train heads for this target")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) last-layer hidden states, before the final norm → (K, ..., V) logits."""
        if not isinstance(hidden, torch.Tensor) or hidden.shape[-1] != self.hidden_size:
            shape = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
            raise ValueError(f"hidden must be a tensor (..., {self.hidden_size}), got {shape}")
        z = rms_norm(hidden.float(), self.final_norm, self.eps)  # (..., D): what the base LM head reads
        out = []
        for block, lm_k in zip(self.blocks, self.lm):
            out.append(lm_k(z + F.silu(block(z))))  # (..., V)
        return torch.stack(out)  # (K, ..., V)

    def top1(self, hidden: torch.Tensor) -> torch.Tensor:
        """(R, D) → (R, K) each head's greedy guess."""
        return self(hidden).argmax(-1).T


# ---------------------------------------------------------------------------------------------- save / load


def save_medusa(heads: MedusaHeads, out: str | Path, dtype: torch.dtype = torch.float16) -> Path:
    """Write ``medusa.safetensors`` (the head weights in ``dtype``, fp16 by default: half the bytes, and the
    heads only propose) with the configuration and fingerprint in its metadata."""
    from safetensors.torch import save_file

    if not isinstance(heads, MedusaHeads):
        raise ValueError(f"heads must be MedusaHeads, got {type(heads).__name__}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in heads.state_dict().items() if k != "final_norm"}
    meta = {
        "num_heads": str(heads.num_heads),
        "hidden_size": str(heads.hidden_size),
        "vocab_size": str(heads.vocab_size),
        "fingerprint": json.dumps(heads.fingerprint),
        "format": "medusa-1: z = rms_norm(h); z + silu(blocks.k(z)) -> lm.k",
    }
    save_file(tensors, str(out / WEIGHTS_FILE), metadata=meta)
    return out / WEIGHTS_FILE


def _resolve(path) -> Path:
    from course_lib.core.paths import data_dir

    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise ValueError(f"path must be {EMBEDDED_NAME!r} or a folder holding {WEIGHTS_FILE}, got {path!r}")
    p = data_dir() / "models" / EMBEDDED_NAME if str(path) == EMBEDDED_NAME else Path(path).expanduser()
    if p.is_dir():
        p = p / WEIGHTS_FILE
    if not p.is_file():
        raise ValueError(f"path: no Medusa weights at {p} (expected {EMBEDDED_NAME!r} or a folder with {WEIGHTS_FILE})")
    return p


def load_medusa(path: str | Path = EMBEDDED_NAME, target: Engine | None = None) -> MedusaHeads:
    """Heads from ``path`` ("tiny-target-medusa", a folder or the .safetensors file) for ``target``; raises
    ValueError when they were trained for another model. Returned in fp32, eval mode, on the target's device."""
    from safetensors import safe_open

    check_engine(target)
    file = _resolve(path)
    with safe_open(str(file), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if "fingerprint" not in meta or "num_heads" not in meta:
        raise ValueError(
            f"path: {file} has no Medusa metadata (num_heads, fingerprint); was it written by save_medusa?"
        )
    why = fingerprint_mismatch(json.loads(meta["fingerprint"]), target_fingerprint(target))
    if why is not None:
        raise ValueError(f"Medusa heads trained for another model: {why} ({file})")
    heads = MedusaHeads(target, int(meta["num_heads"]))
    state = {k: v.float() for k, v in tensors.items()}
    state["final_norm"] = heads.final_norm
    heads.load_state_dict(state)
    return heads.eval().requires_grad_(False)


# ---------------------------------------------------------------------------------------------- top-1 drafts


class MedusaProposer(Proposer):
    """The heads' top-1 guesses as γ = K deterministic drafts for ``SpeculativeDecoder``.

    After each verify forward the decoder calls ``observe(key, Verified)``; ``hidden[accepted]`` is the
    hidden state at the position that produced the pending token, so head k's top-1 there is a guess for
    the k-th token *after* the pending one: exactly draft k. Nothing observed yet (the prefill step) →
    nothing proposed. The drafts are one-hot (q = None): the decoder accepts draft x with probability
    min(1, p(x)/1) = p(x), else draws from norm(p with x zeroed), so P(x) = p(x) and P(y ≠ x) =
    (1 − p(x))·p(y)/(1 − p(x)) = p(y): sampled rows keep the target's distribution exactly, and greedy
    rows ("accept while draft == argmax") are token-identical to plain greedy."""

    wants_hidden = True

    def __init__(self, heads: MedusaHeads, target: Engine | None = None) -> None:
        if not isinstance(heads, MedusaHeads):
            raise ValueError(f"heads must be MedusaHeads (see load_medusa), got {type(heads).__name__}")
        if target is not None:
            heads.check_target(check_engine(target))
        self.heads = heads
        self.vocab_size = heads.vocab_size  # SpeculativeDecoder refuses a target with another vocabulary
        self._hidden: dict = {}  # row key → (D,) hidden state that produced the row's pending token

    def propose(self, context_ids: list[int], k: int) -> list[int]:
        return []  # the heads need the target's hidden state: only the decoder's observe() supplies it

    def observe(self, key, verified: Verified) -> None:
        if not isinstance(verified, Verified) or verified.hidden is None:
            raise ValueError("observe needs a Verified with hidden states (the decoder sends them when wants_hidden)")
        h = verified.hidden[verified.accepted]
        if h.shape != (self.heads.hidden_size,):
            raise ValueError(f"hidden state has shape {tuple(h.shape)}, the heads expect ({self.heads.hidden_size},)")
        self._hidden[key] = h.detach().clone()

    @torch.inference_mode()
    def propose_batch(self, keys, contexts, ks, params, generators) -> list[Proposal]:
        out = [Proposal([]) for _ in keys]
        live = [i for i, (key, k) in enumerate(zip(keys, ks)) if k > 0 and key in self._hidden]
        if live:
            guesses = self.heads.top1(torch.stack([self._hidden[keys[i]] for i in live])).tolist()  # (R, K)
            for r, i in enumerate(live):
                out[i] = Proposal(guesses[r][: ks[i]])
        return out

    def release(self, key) -> None:
        self._hidden.pop(key, None)


def medusa_decoder(target: Engine, heads: MedusaHeads) -> SpeculativeDecoder:
    """``SpeculativeDecoder(target, MedusaProposer(heads, target), gamma=K)``, the fingerprint checked."""
    return SpeculativeDecoder(target, MedusaProposer(heads, target), gamma=heads.num_heads)
