"""Chapter 07 — parallelism: run one function on N processes, and predict what the communication costs.

Submodules (imported on first use, so importing the package stays cheap and starts no process):
- ``launcher`` starts torch.distributed workers (``launch``); ``replica`` serves with N independent engines;
- communication: ``collectives`` measures gloo collectives, ``alpha_beta`` is the ring α–β model and its
  fit, ``interconnects`` the sourced NVLink / PCIe / InfiniBand figures, ``planning`` the memory and time
  of a real model under tensor × pipeline parallelism;
- tensor parallelism: ``tp_plan`` (which heads each rank keeps; KV heads replicated past Hkv), ``tp_comm``
  (the counted collectives), ``tp_layers`` (column- and row-parallel linears), ``tp_load`` (a rank's
  slices read from the checkpoint), ``tp_model`` (the sharded model and its engine), ``sequence_parallel``,
  ``tp_measure``, ``tp_equal`` (TP against one process, logit for logit);
- pipeline parallelism: ``pp_schedule`` (GPipe and its bubble), ``pp_stages`` (one stage's work and
  send/recv), ``pp_measure`` (generation and the measured bubble);
- ``plots`` draws the chapter's figures.
Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import importlib

_SUBMODULES = (
    "alpha_beta",
    "collectives",
    "interconnects",
    "launcher",
    "planning",
    "plots",
    "pp_measure",
    "pp_schedule",
    "pp_stages",
    "replica",
    "sequence_parallel",
    "tp_comm",
    "tp_layers",
    "tp_measure",
    "tp_model",
)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
