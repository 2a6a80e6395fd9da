"""Load one tensor-parallel rank's share of a checkpoint, not the whole model: its slices straight from the file.

A rank that loads the full model and then cuts its shard holds the whole model for a moment — p ranks on
one machine, p whole models at once. ``load_rank_model`` builds the ``transformers`` model on the *meta*
device (shapes, no memory), then reads from the safetensors file only what the rank keeps
(``course_lib.parallel.tp_plan.rank_shard``): the rows of its query heads, of the KV heads they use and
of its MLP features (q/k/v, gate/up), the matching input columns of o and down, and the replicated
embedding, norms and head. The file is opened one layer at a time, so its memory-mapped pages never add
up to the whole file in this process. ``load_for_rank`` chooses: this sliced load where the model is a
folder with ``model.safetensors`` (the course's embedded and installed models), else the full load
(a hub id), which ``tp_model.tp_engine`` then shards and frees. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

from pathlib import Path

import torch

from course_lib.parallel.tp_plan import RankShard, check_tp_degree, rank_shard

_COLUMN_PARALLEL = {"q_proj": "q", "k_proj": "kv", "v_proj": "kv", "gate_proj": "ffn", "up_proj": "ffn"}
_ROW_PARALLEL = {"o_proj": "q", "down_proj": "ffn"}  # their input columns are cut; their bias stays whole


def checkpoint_folder(model: str | Path) -> Path | None:
    """The folder holding ``model``'s ``model.safetensors`` (embedded, installed and converted, or local),
    or None for a hub id. An installed model that is not converted yet raises, naming the command."""
    from course_lib.models import gguf
    from course_lib.models.load import resolve

    kind, path = resolve(model)
    if kind == "hub":
        return None
    if kind == "installed":
        folder = gguf.model_cache_dir(str(model))
        if not gguf.is_cached(str(model), folder):
            raise FileNotFoundError(
                f"{model} is not converted yet in {folder}: convert it once, in one process, before starting "
                f"the ranks (python -m course_lib.models.gguf {model}), so that p ranks do not convert it at once"
            )
        return folder
    return path if (path / "model.safetensors").is_file() else None


def model_config(model: str | Path):
    """The config of ``model``, read without any weight: config.json as attributes for a folder (no
    ``transformers`` import: ``tp_standalone.read_config``), ``transformers``' AutoConfig for a hub id."""
    from course_lib.parallel.tp_standalone import read_config

    folder = checkpoint_folder(model)
    if folder is not None:
        return read_config(folder)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model))


def check_split(config, world_size: int) -> None:
    """``check_tp_degree`` on a ``transformers`` config."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    check_tp_degree(heads, kv_heads, config.intermediate_size, world_size)


def _shard_of(config, rank: int, world_size: int) -> RankShard:
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return rank_shard(heads, kv_heads, config.intermediate_size, rank, world_size)


def _read(handle, key: str, shard: RankShard, head_dim: int, vocab=None) -> torch.Tensor:
    """Tensor ``key`` of the file, cut to what ``shard`` keeps (rows: a view of the mapped file; columns: a copy);
    ``vocab`` (start, stop): the embedding's and the head's vocabulary rows (vocab-parallel), else whole."""
    part = handle.get_slice(key)
    *_, module, kind = key.split(".")  # ..., "q_proj", "weight"
    if vocab is not None and module in ("embed_tokens", "lm_head"):
        return part[vocab[0] : vocab[1]]  # (V/p, D): this rank's ids
    ranges = {
        "q": (shard.q_heads.start * head_dim, shard.q_heads.stop * head_dim),
        "kv": (shard.kv_heads.start * head_dim, shard.kv_heads.stop * head_dim),
        "ffn": (shard.ffn.start, shard.ffn.stop),
    }
    if module in _COLUMN_PARALLEL:
        a, b = ranges[_COLUMN_PARALLEL[module]]
        return part[a:b]  # its output rows (weight (out/p, in), or bias (out/p,))
    if module in _ROW_PARALLEL and kind == "weight":
        a, b = ranges[_ROW_PARALLEL[module]]
        return part[:, a:b]  # its input columns (out, in/p)
    return part[:]  # replicated: embedding, norms, head, the bias of o and down


def _set(model, name: str, tensor: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(module_name), attr, torch.nn.Parameter(tensor, requires_grad=False))


def read_slices(file: Path, names, shard: RankShard, head_dim: int, dtype: torch.dtype, vocab=None) -> dict:
    """{name: rank's slice of it, in ``dtype``, in its own memory}, the file opened one layer at a time, so
    its memory-mapped pages never add up to the whole file in this process."""
    from safetensors import safe_open

    groups: dict[str, list[str]] = {}
    for n in names:  # one group per decoder layer, one for the rest
        parts = n.split(".")
        groups.setdefault(".".join(parts[:3]) if parts[1] == "layers" else "", []).append(n)
    out = {}
    with torch.no_grad():
        for group in groups.values():
            with safe_open(str(file), framework="pt") as handle:  # opened per layer: its mapping ends here
                for n in group:
                    # own memory (clone): a view would keep the file mapped, its pages counted in this process
                    out[n] = _read(handle, n, shard, head_dim, vocab).to(dtype).contiguous().clone()
    return out


def _checked(folder, rank: int, world_size: int, dtype, vocab_parallel: bool):
    from course_lib.parallel.tp_standalone import read_config
    from course_lib.parallel.tp_vocab import vocab_range

    folder = Path(folder)
    file = folder / "model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"{folder} has no model.safetensors to read rank slices from")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    config = read_config(folder)
    shard = _shard_of(config, rank, world_size)  # checks the split and the rank before any weight is read
    vocab = vocab_range(config.vocab_size, rank, world_size) if vocab_parallel else None
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return folder, file, shard, vocab, head_dim


def load_rank_standalone(
    folder: str | Path, rank: int, world_size: int, dtype: torch.dtype = torch.float32, vocab_parallel: bool = False
):
    """(model-like object, tokenizer) with rank's slices, without importing ``transformers``
    (``tp_standalone``), or None where the rope type needs ``transformers`` (use ``load_rank_model``)."""
    from course_lib.parallel.tp_standalone import load_standalone

    folder, file, shard, vocab, head_dim = _checked(folder, rank, world_size, dtype, vocab_parallel)

    def read(names):
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as handle:
            keys = set(handle.keys())
        names = [*names, *(["lm_head.weight"] if "lm_head.weight" in keys else [])]
        missing = [n for n in names if n not in keys]
        if missing:
            raise KeyError(f"{file} lacks {missing[:3]}{' …' if len(missing) > 3 else ''}")
        return read_slices(file, names, shard, head_dim, dtype, vocab)

    got = load_standalone(folder, read)
    if got is not None:
        got[0].tp_slice = (rank, world_size)
    return got


def load_rank_model(
    folder: str | Path, rank: int, world_size: int, dtype: torch.dtype = torch.float32, vocab_parallel: bool = False
):
    """(model, tokenizer): a ``transformers`` model whose decoder projections hold only rank's slices.

    Its config is the whole model's; its q/k/v, o, gate/up and down weights are rank's rows or columns
    (and with ``vocab_parallel`` its embedding and head rank's vocabulary rows), so only
    ``tp_model.shard_model(..., presliced=True)`` should use it (its own forward would fail)."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, file, shard, vocab, head_dim = _checked(folder, rank, world_size, dtype, vocab_parallel)
    config = AutoConfig.from_pretrained(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)  # shapes only: no weight memory
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffers, computed on the CPU
    with safe_open(str(file), framework="pt") as handle:
        keys = set(handle.keys())
    tied = bool(getattr(config, "tie_word_embeddings", False)) and "lm_head.weight" not in keys
    names = [n for n, _ in model.named_parameters(remove_duplicate=False) if not (tied and n == "lm_head.weight")]
    missing = [n for n in names if n not in keys]
    if missing:
        raise KeyError(f"{file} lacks {missing[:3]}{' …' if len(missing) > 3 else ''}")
    with torch.no_grad():
        for n, t in read_slices(file, names, shard, head_dim, dtype, vocab).items():
            _set(model, n, t)
        if tied:
            model.lm_head.weight = model.model.embed_tokens.weight
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise RuntimeError(f"parameters left unloaded: {left[:3]}")
    model.tp_slice = (rank, world_size)
    return model.eval(), tokenizer


def load_for_rank(
    model: str | Path,
    rank: int,
    world_size: int,
    device="cpu",
    dtype: str = "fp32",
    vocab_parallel: bool = False,
    standalone: bool = True,
):
    """(hf_model, tokenizer, presliced): rank's slices only where the checkpoint allows it, else the whole model.
    A safetensors folder on the CPU with the default rope is read without ``transformers`` (``tp_standalone``)
    unless ``standalone=False`` (the ``transformers`` meta-model path, kept to measure what it costs)."""
    from course_lib.core.dtypes import torch_dtype
    from course_lib.models.load import load_model, parse_device

    dev = parse_device(device)
    check_split(model_config(model), world_size)
    folder = checkpoint_folder(model)
    if folder is None:
        hf, tok = load_model(model, device=dev, dtype=dtype)
        return hf, tok, False
    if dev.type == "cpu" and standalone:
        got = load_rank_standalone(folder, rank, world_size, torch_dtype(dtype), vocab_parallel)
        if got is not None:
            return got[0], got[1], True
    hf, tok = load_rank_model(folder, rank, world_size, torch_dtype(dtype), vocab_parallel)
    return hf.to(dev), tok, True


__all__ = [
    "check_split",
    "checkpoint_folder",
    "load_for_rank",
    "load_rank_model",
    "load_rank_standalone",
    "model_config",
    "read_slices",
]
