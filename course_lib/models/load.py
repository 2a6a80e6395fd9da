"""One loader for every model the course runs: the embedded ones by name, an installed one, a folder, a hub id.

    model, tok = load_model("tiny-target")                      # shipped in data/models/, offline
    model, tok = load_model("smollm2-135m-instruct")            # a pip package's GGUF, offline (models.gguf)
    model, tok = load_model("HuggingFaceTB/SmolLM2-135M", device="cuda", dtype="bf16")  # online only

Everything is checked before any weight is read, and nothing half-loaded is returned.
"""

from __future__ import annotations

from pathlib import Path

import torch

from course_lib.core.dtypes import torch_dtype
from course_lib.core.paths import data_dir
from course_lib.models.gguf import SOURCES as GGUF_SOURCES

#: tiny-draft-distilled: tiny-draft's shape and budget, distilled from tiny-target (course_lib.compression.distill);
#: it agrees more with the target (0.550 vs 0.517 top-1 on the validation split), chapter 04's better draft.
EMBEDDED = ("tiny-target", "tiny-draft", "tiny-draft-distilled", "tiny-target-mqa")
#: real pretrained models read from an installed pip package's GGUF file, converted once (models.gguf)
INSTALLED = tuple(GGUF_SOURCES)
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def embedded_dir(name: str) -> Path:
    if name not in EMBEDDED:
        raise ValueError(f"unknown embedded model {name!r}; valid: {list(EMBEDDED)} (or a local path / hub id)")
    return data_dir() / "models" / name


def check_checkpoint(path: Path) -> Path:
    """Raise FileNotFoundError naming each missing file of a checkpoint folder."""
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint folder {path} does not exist")
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint folder {path} is missing {missing}")
    return path


def parse_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be like 'cpu', 'cuda' or 'cuda:0', got {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available on this machine; use 'cpu'")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device type must be 'cpu', 'cuda' or 'mps', got {dev.type!r}")
    return dev


def resolve(name_or_path: str | Path) -> tuple[str, Path | None]:
    """('embedded'|'local', folder), ('installed', GGUF file) or ('hub', None)."""
    if not isinstance(name_or_path, (str, Path)) or not str(name_or_path).strip():
        raise ValueError(
            f"model must be an embedded name {list(EMBEDDED)}, an installed one {list(INSTALLED)}, a folder "
            f"or a hub id, got {name_or_path!r}"
        )
    text = str(name_or_path)
    if text in EMBEDDED:
        return "embedded", check_checkpoint(embedded_dir(text))
    if text in INSTALLED:
        from course_lib.models.gguf import gguf_file

        return "installed", gguf_file(text)  # raises with the install command when the package is missing
    path = Path(text).expanduser()
    if path.exists():
        return "local", check_checkpoint(path)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        return "hub", None
    raise ValueError(
        f"unknown model {text!r}: not an embedded name {list(EMBEDDED)}, an installed one {list(INSTALLED)}, "
        "an existing folder, or a hub id of the form 'owner/name'"
    )


def hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    """Can we open a connection to the hub? (False at once offline, instead of a minute of retries.)"""
    import os
    import socket

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_model(name_or_path: str | Path = "tiny-target", device: str | torch.device = "cpu", dtype: str = "fp32"):
    """(model, tokenizer) ready for inference (``eval()``, on ``device``, weights in ``dtype``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a per-tensor "Loading weights" bar would clutter every notebook
    dev = parse_device(device)
    tdt = torch_dtype(dtype)
    kind, path = resolve(name_or_path)
    source = str(path) if path is not None else str(name_or_path)
    if kind == "hub" and not hub_reachable():
        from huggingface_hub import try_to_load_from_cache

        if try_to_load_from_cache(source, "config.json") is None:  # not cached either: fail now, clearly
            raise OSError(
                f"cannot load hub model {source!r}: the Hugging Face hub is not reachable from this "
                f"machine and the model is not in the local cache. Offline, use an embedded model: "
                f"{list(EMBEDDED)}"
            )
    if kind == "installed":
        from course_lib.models.gguf import load as load_installed

        model, tokenizer = load_installed(str(name_or_path), dtype=tdt)
        return model.to(dev).eval(), tokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=tdt)
    except OSError as exc:
        if kind == "hub":
            raise OSError(
                f"could not load hub model {source!r} (no network or no such repo): {exc}. "
                f"Offline, use an embedded model: {list(EMBEDDED)}"
            ) from exc
        raise
    model.to(dev).eval()
    return model, tokenizer


def random_model(spec_name: str = "bench-80m", device: str | torch.device = "cpu", dtype: str = "fp32", seed: int = 0):
    """(model, tokenizer): a ``family.SPECS`` shape with random weights and the course tokenizer, for speed
    measurements only (its text is noise). Nothing is downloaded or read but the tokenizer."""
    from transformers import LlamaForCausalLM

    from course_lib.models.family import SPECS
    from course_lib.models.tokenizer import load_tokenizer

    if spec_name not in SPECS:
        raise ValueError(f"unknown model spec {spec_name!r}; valid: {sorted(SPECS)}")
    dev, tdt = parse_device(device), torch_dtype(dtype)
    tokenizer = load_tokenizer(data_dir() / "models" / "tokenizer")
    config = SPECS[spec_name].to_config(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(device=dev, dtype=tdt).eval()
    return model, tokenizer
