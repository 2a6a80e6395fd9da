"""Medusa tree decoding: several candidates per head, every path verified in ONE target forward.

The heads rank candidates at the pending token's hidden state; a tree of them (top-s_1 of head 1 ×
top-s_2 of head 2 × …) becomes 1 + N flat tokens with a *tree attention mask*: each node sees the
cached prefix and its own ancestors, nothing else. The target's argmax at each node is what greedy
decoding would emit after that node's path, so the longest agreeing path is accepted, plus one
correction/bonus token; the accepted nodes' K/V are copied into place. The verify forward has 1 + N
query positions instead of 1 + K, still one read of the weights (bandwidth-bound at batch 1).

    MedusaTreeDecoder(target, load_medusa("tiny-target-medusa", target), top=(2, 2, 1, 1)).generate(prompts)

Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from course_lib.engine.engine import Engine
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative.medusa import MedusaHeads, check_engine, positive_int
from course_lib.engine.speculative.stats import SpecStats, SpeculativeOutput, SpeculativeResult


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

        check_engine(target)
        if not isinstance(heads, MedusaHeads):
            raise ValueError(f"heads must be MedusaHeads (see load_medusa), got {type(heads).__name__}")
        heads.check_target(target)
        if not isinstance(target.backend, ContiguousBackend):
            raise ValueError("MedusaTreeDecoder needs the target's ContiguousBackend (it copies accepted K/V in place)")
        positive_int("max_nodes", max_nodes)
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
            positive_int("max_new_tokens", max_new_tokens)
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
                stats.record_step(res, depth, n)  # judged: every offered depth up to the first miss
                stats.history.append([n])
            res.output_ids = ids[len(prompt) :]
            res.finish_reason = finish or "length"
            res.kv_length = kv.length(handle)
        finally:
            kv.free(handle)
        return res
