"""The attention backend seam: KV storage and attention over one flat ragged step.

A backend owns two things the model must not care about: where each sequence's keys and values live
(allocate / append / truncate / fork / free, bytes used vs reserved), and how attention is computed
over a flat batch of new tokens whose sequences have different lengths. The model hands it
``q, k, v`` of shape (N, heads, head_dim) per layer and gets (N, heads, head_dim) back.

- ``ContiguousBackend``: one slab of ``max_len`` slots per sequence + SDPA (chapter 02's behaviour).
- ``NoCacheBackend``: stores nothing; every step recomputes the whole sequence (chapter 05's baseline).
- ``FlashBackend``: the contiguous storage, attention by the Triton FlashAttention kernel (chapter 05).
- ``PagedBackend``: blocks of ``block_size`` tokens from one pool, block tables, reference counts and
  copy-on-write (``BlockManager``; ``OutOfBlocks`` is what the scheduler preempts on); chapter 05.

``FlashBackend`` is imported on first use (it pulls in Triton), so ``import course_lib.engine`` stays light.
"""

from course_lib.engine.attention.base import AttentionBackend, AttentionMetadata, attention_ref
from course_lib.engine.attention.block_manager import BlockManager, OutOfBlocks
from course_lib.engine.attention.contiguous import ContiguousBackend
from course_lib.engine.attention.nocache import NoCacheBackend

__all__ = [
    "BlockManager",
    "OutOfBlocks",
    "PagedBackend",
    "AttentionBackend",
    "AttentionMetadata",
    "ContiguousBackend",
    "FlashBackend",
    "NoCacheBackend",
    "attention_ref",
]


def __getattr__(name: str):
    if name == "FlashBackend":
        from course_lib.engine.attention.flash import FlashBackend

        return FlashBackend
    if name == "PagedBackend":
        from course_lib.engine.attention.paged import PagedBackend

        return PagedBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
