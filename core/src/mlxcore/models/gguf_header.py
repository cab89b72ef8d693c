"""Check a GGUF file's header and tensor table before anything reads its tensors.

MLX's GGUF reader trusts the file: a truncated or corrupt one can crash the
process, so :func:`check_gguf_file` walks the metadata and the tensor table with
bounds checks first.
"""

from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path
from typing import Any

from mlxcore.errors import ModelLoadError

_KV_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def check_gguf_file(path: Path) -> None:
    """Walk a GGUF file's header and tensor table; raise unless every tensor is in the file."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            size, pos = len(mm), 0

            def take(fmt: str) -> tuple[Any, ...]:
                nonlocal pos
                values = struct.unpack_from(fmt, mm, pos)
                pos += struct.calcsize(fmt)
                return values

            def skip(vtype: int, count: int = 1) -> None:
                nonlocal pos
                if vtype in _KV_SIZES:
                    pos += _KV_SIZES[vtype] * count
                elif vtype == 8:
                    for _ in range(count):
                        (length,) = take("<Q")
                        pos += length
                        if pos > size:
                            break
                elif vtype == 9 and count == 1:
                    inner, n = take("<IQ")
                    skip(inner, n)
                else:
                    raise ValueError(f"bad metadata type {vtype}")
                if pos > size:
                    raise ValueError("metadata runs past the end of the file")

            magic, version, n_tensors, n_kv = take("<4sIQQ")
            if magic != b"GGUF" or version not in (2, 3):
                raise ValueError("not a GGUF v2/v3 file")
            alignment = 32
            for _ in range(n_kv):
                (length,) = take("<Q")
                key = bytes(mm[pos : pos + length])
                pos += length
                (vtype,) = take("<I")
                if key == b"general.alignment" and vtype == 4:
                    (alignment,) = take("<I")
                else:
                    skip(vtype)
            tensors = []
            for _ in range(n_tensors):
                (length,) = take("<Q")
                pos += length
                dims = take(f"<{take('<I')[0]}Q")
                tensors.append((dims, *take("<IQ")))
            start = -(-pos // alignment) * alignment
            for dims, ttype, offset in tensors:
                block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
                if start + offset + math.prod(dims) // block * nbytes > size:
                    raise ValueError("tensor data runs past the end of the file (truncated?)")
    except (OSError, ValueError, KeyError, struct.error) as exc:
        raise ModelLoadError(f"GGUF file {path} is corrupt or truncated: {exc}") from exc
