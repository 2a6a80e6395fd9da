"""Vocabulary-parallel embedding and LM head (Megatron-LM): each rank holds V/p rows of the vocabulary matrix.

The embedding and the LM head are (V, D) matrices, the largest single tensors of a small model (SmolLM2:
49,152 × 576, 113 MB in fp32; Llama-3: 128k × 8,192, 2.1 GB in bf16) and, replicated, the same on every
rank. Megatron-LM (Shoeybi et al. 2019) and vLLM cut them by vocabulary rows instead: rank r holds the
ids [r·V/p, (r+1)·V/p).
- The *embedding* looks up only the ids in its range (the others masked to row 0 and their output
  zeroed), so each token's row is non-zero on exactly one rank, and ONE all-reduce of (N, D) gives every
  rank the full embeddings (exact: the other ranks add zeros).
- The *LM head* is column-parallel over the vocabulary: each rank computes the logits of its own ids,
  (N, V/p), and one all-gather puts the (N, V) logits on every rank in vocabulary order (exact: nothing is
  summed). Greedy decoding could instead exchange each rank's (max, argmax): p·N pairs instead of N·V.
With tied embeddings both use the same (V/p, D) slice. Both are bandwidth-bound in decode (the head reads
all its rows per token); the gain is memory and 1/p of the head's bytes per rank. Introduced in
07_parallelism.ipynb.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.engine.layers import Linear, SkinnyLinear
from course_lib.parallel.tp_comm import Comm


def vocab_range(vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of the vocabulary ids rank holds: V/p consecutive ids."""
    if not isinstance(world_size, int) or world_size < 1 or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, world_size), world_size >= 1; got {rank!r}, {world_size!r}")
    if vocab_size % world_size:
        raise ValueError(
            f"vocab_size={vocab_size} cannot be split evenly over world_size={world_size} (Megatron pads the "
            f"vocabulary to a multiple of p; this course does not): use a world_size dividing {vocab_size}"
        )
    step = vocab_size // world_size
    return rank * step, (rank + 1) * step


class VocabParallelEmbedding:
    """ids (N,) → (N, D): look up the ids in this rank's range, zero the rest, all-reduce."""

    def __init__(self, weight: torch.Tensor, start: int, vocab_size: int, comm: Comm) -> None:
        self.weight = weight  # (V/p, D): rows start .. start + V/p of the full table
        self.start, self.stop, self.vocab_size, self.comm = start, start + weight.shape[0], vocab_size, comm

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        mine = (input_ids >= self.start) & (input_ids < self.stop)  # (N,) ids this rank holds
        local = torch.where(mine, input_ids - self.start, 0)  # (N,) row in the slice; others → row 0
        x = F.embedding(local, self.weight) * mine[:, None].to(self.weight.dtype)  # (N, D), zero where not mine
        return self.comm.all_reduce(x)  # (N, D): each row non-zero on exactly one rank


class VocabParallelHead(Linear):
    """hidden (N, D) → logits (N, V): this rank's (N, V/p) logits, all-gathered in vocabulary order."""

    def __init__(self, weight: torch.Tensor, comm: Comm, like: Linear | None = None) -> None:
        super().__init__(weight)  # (V/p, D)
        self.comm = comm
        self.local = SkinnyLinear(weight) if isinstance(like, SkinnyLinear) else Linear(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = self.local(x)  # (N, V/p)
        p = self.comm.world_size
        if p == 1:
            return part
        n, vp = part.shape
        gathered = self.comm.all_gather_tokens(part)  # (p·N, V/p): rank r's block of rows r·N .. (r+1)·N
        return gathered.view(p, n, vp).transpose(0, 1).reshape(n, p * vp)  # (N, V), ids in order


def shard_vocab(model, rank: int, world_size: int, comm: Comm, presliced: bool = False) -> int:
    """Make the engine model's embedding and LM head vocabulary-parallel, in place; returns the bytes of
    vocabulary rows this rank no longer holds. ``presliced``: its tables already hold only rank's rows
    (``tp_load`` read them so); a tied head shares the embedding's slice."""
    V = model.vocab_size
    start, stop = vocab_range(V, rank, world_size)
    emb, head = model.embed_weight, model.lm_head.weight
    tied = emb.data_ptr() == head.data_ptr()
    want = stop - start if presliced else V
    if emb.shape[0] != want or head.shape[0] != want:
        raise ValueError(
            f"embedding {tuple(emb.shape)} / head {tuple(head.shape)} do not hold {want} vocabulary rows: "
            f"presliced={presliced} does not match how the model was loaded"
        )
    new_emb = emb if presliced else emb[start:stop].clone()  # (V/p, D), own memory
    new_head = new_emb if tied else (head if presliced else head[start:stop].clone())
    model.embed_weight = new_emb
    model.embed = VocabParallelEmbedding(new_emb, start, V, comm)  # instance attribute: forward calls it
    model.set_linear("lm_head", VocabParallelHead(new_head, comm, like=model.lm_head))
    model.vocab_parallel = (start, stop)
    rows = (V - (stop - start)) * emb.shape[1] * emb.element_size()
    return rows * (1 if tied else 2)


__all__ = ["VocabParallelEmbedding", "VocabParallelHead", "shard_vocab", "vocab_range"]
