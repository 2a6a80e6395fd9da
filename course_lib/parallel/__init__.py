"""Chapter 07 — parallelism: run one function on N processes, and predict what the communication costs.

Submodules (imported on first use, so importing the package stays cheap and starts no process):
``launcher`` starts torch.distributed workers (``launch``), ``comm`` measures collectives and fits the
α–β model; ``tensor``, ``pipeline`` and ``replica`` hold the parallel layers and schedules.
Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import importlib

_SUBMODULES = ("comm", "launcher", "pipeline", "replica", "tensor")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
