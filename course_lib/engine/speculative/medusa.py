"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads"): K small heads on the target's last hidden state guess the tokens 2..K+1 steps ahead.

No draft model, no second KV cache: head k (1-based) reads the hidden state h_t that the target already
computed at position t (the one whose base LM head produces token t+1) and predicts token t+1+k. Each
head is a Medusa-1 block on the target's final RMSNorm: ``z = norm(h); z + SiLU(W z + b)`` then its own
linear to the vocabulary, initialised from the target's LM head with W = b = 0 (so an untrained head is
exactly the base head). The heads are trained on the *frozen* target with
Σ_k 0.8^k · CE(head_k(h_t), x_{t+1+k}).

Decoding plugs into ``SpeculativeDecoder``: ``MedusaProposer`` keeps, per row, the hidden state at the
position that produced the pending token (``Verified.hidden[accepted]``) and proposes the heads' top-1
tokens as γ = K deterministic drafts. Drafts are one-hot (q = None), which the decoder's rejection rule
already handles, so greedy output is token-identical and sampled output follows the target's
distribution. ``MedusaTreeDecoder`` (batch 1, greedy) verifies a *tree* of candidates (top-s_k per head)
in ONE target forward with a tree attention mask, then copies the accepted path's K/V into place.

Cost. On a big model the heads are ~free: a D×V projection per head next to billions of weights. Our
target is tiny (5M parameters, V = 4096, D = 256), so one head's D×V + D² is ~1.1M weights, ~22% of a
target forward's weight reads: the cost ratio c is not negligible here, ``measure_medusa`` measures it.
Decode stays bandwidth-bound; a verify over K+1 (or 1+nodes) positions reads the weights once.

    python -m course_lib.engine.speculative.medusa train --heads 4 --steps 300 --batch 8 --seq-len 256 --lr 2e-3 \\
        --seed 0 --eval-every 100 --threads 2 --out data/models/tiny-target-medusa
    heads = load_medusa("tiny-target-medusa", target)
    SpeculativeDecoder(target, MedusaProposer(heads, target), gamma=heads.num_heads).generate(prompts)

Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.engine.engine import Engine
from course_lib.engine.model import rms_norm
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative import (
    Proposal,
    Proposer,
    SpecStats,
    SpeculativeDecoder,
    SpeculativeOutput,
    SpeculativeResult,
    Verified,
)

HEAD_DECAY = 0.8  # Medusa's λ_k = 0.8^k: later heads are less accurate and weigh less in the loss
WEIGHTS_FILE = "medusa.safetensors"
EMBEDDED_NAME = "tiny-target-medusa"
_PROBE = 16  # LM-head values stored in the fingerprint


# ---------------------------------------------------------------------------------------------- the heads


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int ≥ 1, got {value!r}")
    return value


def _check_engine(target, name: str = "target") -> Engine:
    if not isinstance(target, Engine):
        raise ValueError(f"{name} must be an Engine (e.g. Engine('tiny-target')), got {type(target).__name__}")
    return target


def target_fingerprint(target: Engine) -> dict:
    """What identifies the target the heads were trained on: shape, plus a probe of LM-head values (kept as
    numbers, compared with a tolerance, so the same target loaded in fp16/bf16 still matches)."""
    _check_engine(target)
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
        _check_engine(target)
        _positive_int("num_heads", num_heads)
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

    _check_engine(target)
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


# ---------------------------------------------------------------------------------------------- training


def target_hidden(target: Engine, x: torch.Tensor) -> torch.Tensor:
    """(B, T) ids, each row from position 0 → (B, T, D) last-layer hidden states before the final norm,
    from the engine's own forward (no cache): what the decoder hands the heads at decode time."""
    from course_lib.engine.attention import NoCacheBackend

    m = target.model
    B, T = x.shape
    backend = NoCacheBackend(T)
    positions = torch.arange(T, device=m.device).repeat(B)  # (B·T,)
    meta = backend.prepare([backend.allocate() for _ in range(B)], [T] * B, positions)
    with torch.no_grad():
        h = m.run_layers(m.embed(x.reshape(-1).to(m.device)), positions, meta, backend)  # (B·T, D)
    return h.view(B, T, -1).float()


def head_losses(heads: MedusaHeads, hidden: torch.Tensor, x: torch.Tensor) -> tuple[list[torch.Tensor], list[float]]:
    """Per head k: CE(head_k(h_t), x_{t+1+k}) over every t that has such a token, and top-1 accuracy.
    ``hidden`` (B, T, D) at the inputs ``x`` (B, T+1) (the window including the next token)."""
    T = hidden.shape[1]
    logits = heads(hidden)  # (K, B, T, V)
    losses, accs = [], []
    for k in range(1, heads.num_heads + 1):
        lg = logits[k - 1, :, : T - k]  # (B, T-k, V): positions t with t+1+k inside the window
        y = x[:, 1 + k : T + 1].to(lg.device)  # (B, T-k)
        losses.append(F.cross_entropy(lg.flatten(0, 1), y.flatten()))
        accs.append(float((lg.argmax(-1) == y).float().mean()))
    return losses, accs


@torch.no_grad()
def evaluate_heads(heads: MedusaHeads, target: Engine, data: np.ndarray, seq_len: int, max_tokens: int) -> dict:
    """Per-head loss and top-1 accuracy on consecutive windows of ``data`` (e.g. the validation split)."""
    from course_lib.models.quality import _windows

    was = heads.training
    heads.eval()
    K = heads.num_heads
    loss, acc, n = [0.0] * K, [0.0] * K, 0
    for w in _windows(data, seq_len, max_tokens):
        x = torch.from_numpy(w[None])  # (1, T+1)
        losses, accs = head_losses(heads, target_hidden(target, x[:, :-1]), x)
        n += 1
        for k in range(K):
            loss[k] += float(losses[k])
            acc[k] += accs[k]
    heads.train(was)
    return {"loss": [v / n for v in loss], "top1": [v / n for v in acc], "tokens": n * seq_len}


def train_heads(
    target: Engine,
    heads: MedusaHeads | None = None,
    num_heads: int = 4,
    steps: int = 20,
    batch: int = 4,
    seq_len: int = 128,
    lr: float = 1e-3,
    seed: int = 0,
    eval_every: int | None = None,
    eval_tokens: int = 4096,
    threads: int | None = None,
    out: str | Path | None = None,
    command: str = "",
    progress: bool = False,
    data: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict:
    """Train Medusa heads on the frozen ``target`` with Σ_k 0.8^k·CE(head_k(h_t), x_{t+1+k}); the defaults
    are a notebook's quick run (seconds). Returns the log: per step the training loss, per evaluation the
    validation loss and top-1 accuracy of every head. With ``out`` the heads, ``train_log.json`` are saved."""
    from course_lib.core.paths import data_dir
    from course_lib.models.train import get_batch, load_tokenizer, lr_at, make_optimizer, run_info, token_ids
    from course_lib.models.train import warmup_steps as warmup_of

    _check_engine(target)
    for name, value in (("num_heads", num_heads), ("steps", steps), ("batch", batch), ("seq_len", seq_len)):
        _positive_int(name, value)
    _positive_int("eval_tokens", eval_tokens)
    if eval_every is not None:
        _positive_int("eval_every", eval_every)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if seq_len <= num_heads + 1:
        raise ValueError(f"seq_len must exceed num_heads + 1 = {num_heads + 1} (head k needs a token k+1 ahead)")
    if seq_len > target.model.max_position:
        raise ValueError(f"seq_len {seq_len} exceeds the target's context window {target.model.max_position}")
    if heads is None:
        torch.manual_seed(seed)
        heads = MedusaHeads(target, num_heads)
    elif not isinstance(heads, MedusaHeads):
        raise ValueError(f"heads must be MedusaHeads or None, got {type(heads).__name__}")
    else:
        heads.check_target(target)
    if threads:
        torch.set_num_threads(threads)
    if data is None:
        tok = load_tokenizer(data_dir() / "models" / "tokenizer")
        data = (token_ids(tok, "train"), token_ids(tok, "val"))
    train_ids, val_ids = data
    heads.train().requires_grad_(True)
    opt = make_optimizer(heads, lr)
    gen = torch.Generator().manual_seed(seed)
    warmup = warmup_of(steps)
    weights = [HEAD_DECAY**k for k in range(1, heads.num_heads + 1)]
    log: dict = {"train": [], "eval": []}
    start = time.perf_counter()
    ema = None

    def evaluate(step: int, final: bool) -> None:
        m = evaluate_heads(heads, target, val_ids, seq_len, eval_tokens if final else min(eval_tokens, 16_384))
        rec = {"step": step, "wall_s": round(time.perf_counter() - start, 1), "train_ema": ema, "val": m}
        log["eval"].append(rec)
        if progress:
            loss = " ".join(f"{v:.3f}" for v in m["loss"])
            acc = " ".join(f"{v:.3f}" for v in m["top1"])
            print(
                f"step {step}: train~{ema if ema is not None else math.nan:.3f} val loss per head [{loss}] top-1 per head [{acc}]",
                flush=True,
            )
        if out is not None:
            save_medusa(heads, out)
            info = {
                "model": "tiny-target-medusa",
                "target_fingerprint": heads.fingerprint,
                "num_heads": heads.num_heads,
                "loss": "sum_k 0.8^k * CE(head_k(h_t), x_{t+1+k}), target frozen",
                "command": command,
                "eval_tokens": eval_tokens,
                **run_info(heads, steps, batch, seq_len, lr, seed, train_ids, val_ids, step, final, log["eval"]),
                "train_loss": log["train"],
            }
            Path(out, "train_log.json").write_text(json.dumps(info, indent=1))

    if eval_every:  # step 0: the untrained heads, each a copy of the base head (they predict t+1, asked for t+1+k)
        evaluate(0, final=False)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        x, y = get_batch(train_ids, batch, seq_len, gen)  # (B, T) each
        x, y = x.to(next(heads.parameters()).device), y.to(next(heads.parameters()).device)
        window = torch.cat([x, y[:, -1:]], dim=1)  # (B, T+1)
        hidden = target_hidden(target, x)  # (B, T, D), frozen target
        losses, accs = head_losses(heads, hidden, window)
        loss = sum(w * v for w, v in zip(weights, losses))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(heads.parameters(), 1.0)
        opt.step()
        value = float(loss.detach())
        ema = value if ema is None else 0.95 * ema + 0.05 * value
        log["train"].append(
            {"step": step + 1, "loss": round(value, 4), "per_head": [round(float(v.detach()), 4) for v in losses]}
        )
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            evaluate(step + 1, final=False)
    evaluate(steps, final=True)
    heads.eval().requires_grad_(False)
    log["wall_s"] = time.perf_counter() - start
    log["heads"] = heads
    return log


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
            heads.check_target(_check_engine(target))
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


# ---------------------------------------------------------------------------------------------- tree attention


def tree_from_top(top) -> list[tuple[int, ...]]:
    """Every path of the Cartesian tree "top-s_1 of head 1 × top-s_2 of head 2 × …": (2, 2, 1) gives
    (0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1), then each extended by (…, 0). A path (i_1, …, i_d) is the
    node whose token is head d's i_d-th best guess, under the node (i_1, …, i_{d-1})."""
    if not isinstance(top, (list, tuple)) or not top or not all(_is_pos_int(s) for s in top):
        raise ValueError(f"top must be a non-empty list of ints ≥ 1 (candidates per head), got {top!r}")
    paths: list[tuple[int, ...]] = []
    frontier: list[tuple[int, ...]] = [()]
    for s in top:
        frontier = [p + (i,) for p in frontier for i in range(s)]
        paths += frontier
    return paths


def _is_pos_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def check_tree(paths, num_heads: int, max_nodes: int = 64) -> list[tuple[int, ...]]:
    """Validate a candidate tree (a list of paths) and return it sorted by depth, then path (parents first)."""
    if not isinstance(paths, (list, tuple)) or not paths:
        raise ValueError(f"tree must be a non-empty list of paths (tuples of candidate indices), got {paths!r}")
    out = []
    for p in paths:
        if not isinstance(p, (list, tuple)) or not p or not all(isinstance(i, int) and i >= 0 for i in p):
            raise ValueError(f"tree paths must be non-empty tuples of ints ≥ 0, got {p!r}")
        out.append(tuple(p))
    if len(set(out)) != len(out):
        raise ValueError("tree has a repeated path")
    if len(out) > max_nodes:
        raise ValueError(f"tree has {len(out)} nodes, more than max_nodes={max_nodes}")
    deepest = max(len(p) for p in out)
    if deepest > num_heads:
        raise ValueError(f"tree is {deepest} deep but there are only {num_heads} heads (one head per depth)")
    have = set(out)
    for p in out:
        if len(p) > 1 and p[:-1] not in have:
            raise ValueError(f"tree path {p} has no parent {p[:-1]} in the tree")
    return sorted(out, key=lambda p: (len(p), p))


def tree_mask(paths: list[tuple[int, ...]]) -> torch.Tensor:
    """(N+1, N+1) bool for the root (index 0, the pending token) and the sorted ``paths`` (1..N): row i
    sees column j iff j is i or an ancestor of i. Prefix keys (the cache) are all visible, added by the caller."""
    index = {p: i + 1 for i, p in enumerate(paths)}
    n = len(paths) + 1
    mask = torch.eye(n, dtype=torch.bool)
    mask[:, 0] = True  # every node descends from the root
    for p, i in index.items():
        if len(p) > 1:
            mask[i] |= mask[index[p[:-1]]]  # parents come first, so their row is already complete
    return mask


@dataclass
class TreeStats(SpecStats):
    """SpecStats of a tree run: position j counts "the tree offered depth j" and "the accepted path
    reached depth j", so ``acceptance_at`` compares with the top-1 chain's; ``nodes`` sums tree sizes."""

    nodes: int = 0  # tree nodes verified, all steps
    prefills: int = 0  # target forwards that only prefilled a prompt (no tree)

    @property
    def nodes_per_forward(self) -> float:
        """Mean tree nodes (draft positions) per verify forward."""
        n = self.target_forwards - self.prefills
        return self.nodes / n if n > 0 else math.nan

    @property
    def verify_time(self) -> float:
        """Mean seconds of one tree verify forward (``first_forward_time`` sums every prompt's prefill)."""
        n = self.target_forwards - self.prefills
        return (self.target_time - self.first_forward_time) / n if n > 0 else math.nan


class MedusaTreeDecoder:
    """Greedy Medusa decoding with a candidate tree verified in ONE target forward per step (batch 1).

    Each step the heads rank candidates at the pending token's hidden state; the tree (``tree_from_top``
    or explicit paths) becomes 1 + N flat tokens at positions cached + depth, with a mask where each node
    sees the cached prefix and its own ancestors (``tree_mask``). The target's argmax at each node is
    what greedy decoding would emit after that node's path, so we walk from the root taking the child
    whose token equals the argmax: the longest path that plain greedy would have produced, plus one
    correction/bonus token. The accepted nodes' K/V were written at flat slots cached + index; they are
    computed at the right positions (RoPE at cached + depth) attending to exactly the accepted path, so
    copying them to slots cached + 1..n (≤ K tokens × layers × 2 × Hkv × hd, a few KB here) and truncating
    makes the cache what sequential decoding writes, without re-running anything. The cost of the tree
    itself: the verify forward has 1 + N query positions instead of 1 + K (still one read of the weights)."""

    def __init__(self, target: Engine, heads: MedusaHeads, top=(2, 2, 1, 1), tree=None, max_nodes: int = 64) -> None:
        from course_lib.engine.attention import ContiguousBackend

        _check_engine(target)
        if not isinstance(heads, MedusaHeads):
            raise ValueError(f"heads must be MedusaHeads (see load_medusa), got {type(heads).__name__}")
        heads.check_target(target)
        if not isinstance(target.backend, ContiguousBackend):
            raise ValueError("MedusaTreeDecoder needs the target's ContiguousBackend (it copies accepted K/V in place)")
        _positive_int("max_nodes", max_nodes)
        paths = tree_from_top(top) if tree is None else tree
        self.target, self.heads = target, heads
        self.paths = check_tree(paths, heads.num_heads, max_nodes)
        self.mask = tree_mask(self.paths).to(target.device)  # (N+1, N+1)
        self.depth = [0] + [len(p) for p in self.paths]
        self.width = [max([p[d] for p in self.paths if len(p) > d]) + 1 for d in range(max(self.depth))]
        self.parent = [-1] + [0 if len(p) == 1 else self.paths.index(p[:-1]) + 1 for p in self.paths]

    def _candidates(self, hidden: torch.Tensor, max_depth: int) -> list[int]:
        """Node tokens (N,) from the heads' ranked guesses at ``hidden`` (D,), nodes deeper than max_depth → -1."""
        logits = self.heads(hidden[None])[:, 0]  # (K, V)
        ranked = [logits[d].topk(w).indices.tolist() for d, w in enumerate(self.width)]
        return [ranked[len(p) - 1][p[-1]] if len(p) <= max_depth else -1 for p in self.paths]

    @torch.inference_mode()
    def generate(self, prompts, params: SamplingParams | None = None, max_new_tokens: int | None = None):
        """Greedy generation, one prompt at a time; token-identical to ``target.generate``."""
        from course_lib.engine.sampler import is_penalised

        tgt = self.target
        ids = tgt.encode(prompts)
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if not params.greedy or is_penalised(params) or params.stop:
            raise ValueError("params: MedusaTreeDecoder is greedy only (temperature 0, no penalties, no stop strings)")
        if max_new_tokens is not None:
            _positive_int("max_new_tokens", max_new_tokens)
        n_new = params.max_new_tokens if max_new_tokens is None else max_new_tokens
        for p in ids:  # a verify forward briefly holds all N nodes past the cached prefix
            tgt.check_fits([p], n_new + len(self.paths))
        stats = TreeStats(max(self.depth))
        results = [self._one(p, n_new, params.ignore_eos, stats) for p in ids]
        return SpeculativeOutput(results, stats)

    def _forward(self, handle, tokens: list[int], positions: list[int], mask: torch.Tensor | None) -> torch.Tensor:
        """One target forward of ``tokens`` for one row; ``mask`` (T, T) over the new tokens replaces the causal one."""
        tgt, kv, m = self.target, self.target.backend, self.target.model
        s = kv.length(handle)
        kv.append(handle, len(tokens))
        pos = torch.tensor(positions, device=tgt.device)
        meta = kv.prepare([handle], [len(tokens)], pos)  # kind "single": mask (T, s+T) broadcast over heads
        if mask is not None:
            full = torch.ones(len(tokens), s + len(tokens), dtype=torch.bool, device=tgt.device)
            full[:, s:] = mask  # the cached prefix is visible to every node; among new tokens: ancestors only
            meta.mask, meta.is_causal = full, False
        return m.run_layers(m.embed(torch.tensor(tokens, device=tgt.device)), pos, meta, kv)  # (T, D)

    def _one(self, prompt: list[int], n_new: int, ignore_eos: bool, stats: TreeStats) -> SpeculativeResult:
        tgt, kv, m = self.target, self.target.backend, self.target.model
        res = SpeculativeResult(prompt, [], "length")
        handle = kv.allocate()
        try:
            t0 = time.perf_counter()
            hidden = self._forward(handle, prompt, list(range(len(prompt))), None)[-1]  # prefill: (D,)
            ids = prompt + [int(m.head(hidden[None]).argmax(-1))]
            dt = time.perf_counter() - t0
            stats.target_time += dt
            stats.first_forward_time += dt
            stats.target_forwards += 1
            stats.row_steps += 1
            stats.generated += 1
            stats.prefills += 1
            finish = "eos" if not ignore_eos and ids[-1] in tgt.eos_ids else None
            while finish is None and len(ids) - len(prompt) < n_new:
                room = n_new - (len(ids) - len(prompt))
                t0 = time.perf_counter()
                toks = self._candidates(hidden, room - 1)
                live = [0] + [i + 1 for i, t in enumerate(toks) if t >= 0]  # root + nodes that fit
                t1 = time.perf_counter()
                s = len(ids) - 1
                flat = [ids[-1]] + [toks[i - 1] for i in live[1:]]
                pos = [s + self.depth[i] for i in live]
                hid = self._forward(handle, flat, pos, self.mask[live][:, live])  # (T, D)
                argmax = m.head(hid).argmax(-1).tolist()  # (T,)
                where = {node: j for j, node in enumerate(live)}  # tree node → flat index
                cur, path = 0, []
                while True:  # walk down while a child carries exactly the token greedy decoding emits next
                    nxt = [c for c in live[1:] if self.parent[c] == cur and toks[c - 1] == argmax[where[cur]]]
                    if not nxt:
                        break
                    cur = nxt[0]
                    path.append(cur)
                new = [toks[c - 1] for c in path] + [argmax[where[cur]]]
                # make the cache contiguous: accepted node j's K/V from slot s + flat index to slot s + j
                src = torch.tensor([s + where[c] for c in path], dtype=torch.long, device=tgt.device)
                if len(path):
                    dst = torch.arange(s + 1, s + 1 + len(path), device=tgt.device)
                    row = handle
                    for t in kv.k + kv.v:  # per layer (rows, Hkv, max_len, hd)
                        t[row, :, dst] = t[row, :, src]
                if not ignore_eos:
                    for j, t in enumerate(new):
                        if t in tgt.eos_ids:
                            new, finish = new[: j + 1], "eos"
                            break
                new = new[:room]
                ids += new
                kv.truncate(handle, len(ids) - 1)  # the newest token is pending
                hidden = hid[where[cur]]  # produced the new pending token (when not cut by EOS / length)
                t2 = time.perf_counter()
                depth = max(self.depth[i] for i in live)
                n = len(path)
                stats.proposer_time += t1 - t0
                stats.target_time += t2 - t1
                stats.target_forwards += 1
                stats.row_steps += 1
                stats.generated += len(new)
                stats.nodes += len(live) - 1
                stats.proposed += depth
                stats.accepted += n
                if hasattr(stats, "examined_at"):  # judged: every offered depth up to the first miss
                    stats.examined += min(n + 1, depth)
                    for j in range(min(n + 1, depth)):
                        stats.examined_at[j] += 1
                for j in range(depth):
                    stats.proposed_at[j] += 1
                for j in range(n):
                    stats.accepted_at[j] += 1
                res.proposed += depth
                res.accepted += n
                res.accepted_per_step.append(n)
                stats.history.append([n])
            res.output_ids = ids[len(prompt) :]
            res.finish_reason = finish or "length"
            res.kv_length = kv.length(handle)
        finally:
            kv.free(handle)
        return res


# ---------------------------------------------------------------------------------------------- measurement

#: code prompts for ``measure_medusa``: the speculative benchmark's and the model card's greedy-sample prompts
CODE_PROMPTS = (
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b",
    "def fibonacci(n):",
    "import os\nimport sys\nimport re",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x",
)


def _best_time(fn, repeats: int) -> float:
    """The least-disturbed of ``repeats`` runs (other jobs only ever add time): ``bench.benchmark``'s best."""
    from course_lib.measure.bench import benchmark

    return benchmark(fn, warmup=0, repeats=repeats, label="medusa").best_s


def _merge_stats(parts: list[SpecStats]) -> SpecStats:
    """Sum the counters (numbers, per-position lists) of several runs' stats; history is dropped."""
    out = type(parts[0])(parts[0].gamma)
    for f in dataclasses.fields(out):
        if f.name in ("gamma", "history"):
            continue
        for p in parts:
            a, b = getattr(out, f.name), getattr(p, f.name)
            setattr(out, f.name, [x + y for x, y in zip(a, b)] if isinstance(a, list) else a + b)
    return out


def measure_medusa(
    target: Engine,
    heads: MedusaHeads,
    prompts=CODE_PROMPTS,
    max_new_tokens: int = 48,
    repeats: int = 3,
    top=(2, 2, 1, 1),
) -> dict:
    """Greedy, batch 1, each prompt on its own: plain ``target.generate`` vs Medusa top-1 (γ = K through
    ``SpeculativeDecoder``) vs the Medusa tree. Per method: per-head (per-depth) acceptance, tokens per
    target forward, c (heads' seconds per draft token / seconds per verify forward), best-of-``repeats``
    seconds, speedup over plain and whether every output was token-identical to plain greedy."""
    from course_lib.measure.report import machine_name

    _check_engine(target)
    heads.check_target(target)
    _positive_int("max_new_tokens", max_new_tokens)
    _positive_int("repeats", repeats)
    ids = target.encode(list(prompts))
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    reference = [target.generate([p], params)[0].output_ids for p in ids]
    plain = _best_time(lambda: [target.generate([p], params) for p in ids], repeats)
    rows = [dict(method="plain", acceptance_at=[], tokens_per_forward=1.0, c=math.nan, seconds=plain, speedup=1.0)]
    rows[0]["identical"] = True
    methods = {
        f"medusa top-1 (γ={heads.num_heads})": medusa_decoder(target, heads),
        f"medusa tree top={tuple(top)}": MedusaTreeDecoder(target, heads, top=top),
    }
    for name, dec in methods.items():

        def run(dec=dec):
            return [dec.generate([p], params) for p in ids]

        outs = run()
        seconds = _best_time(run, repeats)
        st = _merge_stats([o.stats for o in outs])  # all prompts' counters together
        # tokens per forward excluding the prefill forwards (each yields one token for either method)
        decode_fwd = st.target_forwards - len(outs)
        row = dict(
            method=name,
            acceptance_at=st.acceptance_at,
            tokens_per_forward=(st.generated - len(outs)) / decode_fwd if decode_fwd else math.nan,
            c=(st.proposer_time / st.proposed) / ((st.target_time - st.first_forward_time) / decode_fwd)
            if st.proposed and decode_fwd
            else math.nan,
            seconds=seconds,
            speedup=plain / seconds,
            identical=[o[0].output_ids for o in outs] == reference,
        )
        if isinstance(st, TreeStats):
            row["nodes_per_forward"] = sum(o.stats.nodes for o in outs) / decode_fwd
        rows.append(row)
    return {
        "machine": machine_name(),
        "prompts": len(ids),
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "rows": rows,
    }


def format_medusa_table(result: dict) -> str:
    """The ``measure_medusa`` result as a fixed-width text table."""
    lines = [
        f"# {result['machine']}; {result['prompts']} prompts × {result['max_new_tokens']} new tokens, batch 1, greedy,"
        f" best of {result['repeats']}",
        f"{'method':<32}{'acceptance per head':<30}{'tok/fwd':>8}{'c':>7}{'s':>8}{'speedup':>9}{'identical':>10}",
    ]
    for r in result["rows"]:
        acc = " ".join(f"{a:.2f}" for a in r["acceptance_at"]) or "-"
        lines.append(
            f"{r['method']:<32}{acc:<30}{r['tokens_per_forward']:>8.2f}{r['c']:>7.3f}{r['seconds']:>8.3f}"
            f"{r['speedup']:>8.2f}x{str(r['identical']):>10}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.engine.speculative.medusa",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train", help="train Medusa heads on the frozen tiny-target")
    p.add_argument("--target", default="tiny-target", help="embedded model name or checkpoint folder")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-tokens", type=int, default=1_000_000, help="validation tokens, final evaluation")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    command = "python -m course_lib.engine.speculative.medusa " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    torch.set_num_threads(args.threads)
    target = Engine(args.target)
    log = train_heads(
        target,
        num_heads=args.heads,
        steps=args.steps,
        batch=args.batch,
        seq_len=args.seq_len,
        lr=args.lr,
        seed=args.seed,
        eval_every=args.eval_every,
        eval_tokens=args.eval_tokens,
        threads=args.threads,
        out=args.out,
        command=command,
        progress=True,
    )
    final = log["eval"][-1]
    print(json.dumps({"final": final, "wall_s": round(log["wall_s"], 1)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
