"""Re-encode a GGUF file's tensors (Q4_1 → F32 or Q8_0) with llama.cpp's own ``gguf`` package, so llama.cpp
can run the very weights the course engine runs, in the format being compared.

llama.cpp's converter (``convert_hf_to_gguf.py``) ships with its source, not with the ``llama-cpp-python``
wheel; the ``gguf`` package it uses does ship, with llama.cpp's reference quantizers in numpy
(``gguf.quants``). ``requantize`` copies every metadata field of the source file, dequantizes each tensor
from its stored type (SmolLM2's file: Q4_1 blocks, some F32 norms) and writes it as F32 (bit-exact: the
values the course engine loads) or re-quantized as Q8_0 (blocks of 32, one fp16 scale: llama.cpp's int8).
Used by ``benchmarks/vs_llamacpp.py``; tested in tests/test_gguf_requant.py. Introduced in
02_metrics_2_throughput_utilization.ipynb (the engine beside llama.cpp).
"""

from __future__ import annotations

from pathlib import Path

TARGETS = ("F32", "Q8_0")


def requantize(src: str | Path, dst: str | Path, target: str = "F32") -> Path:
    """Write ``dst``: ``src``'s metadata and tensors, every float tensor of 2+ dims stored as ``target``
    ("F32" or "Q8_0"); 1-D tensors (norms) stay F32, as llama.cpp's converter keeps them."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize, quantize

    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise ValueError(f"src {str(src)!r} is not a file")
    if dst.resolve() == src.resolve():
        raise ValueError("dst must differ from src: the source is read while the copy is written")
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the header's own fields, and the one the writer sets
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    qtype = GGMLQuantizationType[target]
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type).astype(np.float32)  # the shape numpy holds: reversed dims
        if values.ndim >= 2 and qtype != GGMLQuantizationType.F32:
            writer.add_tensor(t.name, quantize(values, qtype), raw_dtype=qtype)  # shape: from the bytes
        else:
            writer.add_tensor(t.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


__all__ = ["TARGETS", "requantize"]
