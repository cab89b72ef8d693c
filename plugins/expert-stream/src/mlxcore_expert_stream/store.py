"""Routed experts read from a checkpoint's safetensors files, one expert at a time.

mlx-lm keeps a mixture-of-experts layer's routed experts stacked: each projection of a
``SwitchGLU`` is a ``[experts, out, in]`` tensor (with ``scales`` and ``biases`` of the same
leading size when quantized), saved under the module's path by mlx-lm's ``save_model``.
Safetensors stores a tensor row-major after a JSON header, so one expert's slice is one
contiguous byte range: :class:`ExpertFiles` reads just that range (``os.pread``), never
the whole tensor. A file that disappears or is cut short fails the read with an
:class:`ExpertReadError` naming it.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterable
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np

DTYPES: dict[str, tuple[np.dtype, mx.Dtype | None]] = {
    "F32": (np.dtype("<f4"), None),
    "F16": (np.dtype("<f2"), None),
    "BF16": (np.dtype("<u2"), mx.bfloat16),
    "U32": (np.dtype("<u4"), None),
    "U8": (np.dtype("u1"), None),
}
"""Safetensors dtypes an expert slice may have: how numpy reads the bytes, and the MLX
type to view them as where numpy has none (bfloat16)."""


class ExpertReadError(RuntimeError):
    """An expert's bytes could not be read (the file is gone, cut short or changed)."""


@attrs.frozen
class Tensor:
    """Where one stacked tensor lies: its file, dtype, shape and first byte."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's slice."""
        return int(np.prod(self.shape[1:])) * DTYPES[self.dtype][0].itemsize


class ExpertFiles:
    """The tensors of a checkpoint folder by name, readable one expert at a time."""

    def __init__(self, folder: Path) -> None:
        self.tensors: dict[str, Tensor] = {}
        for path in sorted(folder.glob("*.safetensors")):
            with path.open("rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                start = 8 + size + int(entry["data_offsets"][0])
                self.tensors[name] = Tensor(path, entry["dtype"], tuple(entry["shape"]), start)
        self._fds: dict[Path, int] = {}
        self._stale: list[int] = []
        """Descriptors replaced after a failed read, closed when no read is in flight."""
        self._reading = 0
        self._lock = threading.Lock()

    def has(self, names: Iterable[str]) -> bool:
        """Whether every tensor named is in the folder, stacked by expert."""
        return all(n in self.tensors and len(self.tensors[n].shape) >= 2 for n in names)

    def buffer(self, name: str) -> np.ndarray:
        """An empty buffer for one expert's slice of tensor ``name``."""
        return np.empty(self.tensors[name].expert_bytes, dtype=np.uint8)

    def read_into(self, name: str, expert: int, out: np.ndarray) -> None:
        """Read expert ``expert``'s slice of tensor ``name`` into ``out`` (from
        :meth:`buffer`): disk only, no MLX and no allocation, so several threads may
        read at once into buffers the caller made."""
        tensor = self.tensors[name]
        if tensor.dtype not in DTYPES:
            raise ExpertReadError(f"{tensor.path.name}: {name} has dtype {tensor.dtype}")
        count = tensor.expert_bytes
        fd = self._acquire(tensor.path)
        try:
            got = os.preadv(fd, [out.data], tensor.offset + expert * count)
        except OSError as exc:
            self._forget(tensor.path, fd)
            raise ExpertReadError(f"cannot read {tensor.path}: {exc}") from exc
        finally:
            self._release()
        if got != count:
            self._forget(tensor.path, fd)
            raise ExpertReadError(f"{tensor.path} is shorter than its header says")

    def as_array(self, name: str, data: np.ndarray) -> mx.array:
        """One expert's slice of tensor ``name`` from the buffer :meth:`read_into` filled."""
        tensor = self.tensors[name]
        np_type, view = DTYPES[tensor.dtype]
        array = mx.array(data.view(np_type).reshape(tensor.shape[1:]))
        return array.view(view) if view is not None else array

    def _acquire(self, path: Path) -> int:
        """The open file for ``path`` (opened on first use), counted as in use."""
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                try:
                    fd = self._fds[path] = os.open(path, os.O_RDONLY)
                except OSError as exc:
                    raise ExpertReadError(f"cannot open {path}: {exc}") from exc
            self._reading += 1
            return fd

    def _release(self) -> None:
        """One read done; files set aside after a failure close once none is in use
        (another thread may still be reading through the same descriptor)."""
        with self._lock:
            self._reading -= 1
            if self._reading == 0:
                for fd in self._stale:
                    os.close(fd)
                self._stale.clear()

    def _forget(self, path: Path, fd: int) -> None:
        """Reopen ``path`` on the next read (it may have been replaced)."""
        with self._lock:
            if self._fds.get(path) == fd:
                del self._fds[path]
                self._stale.append(fd)

    def close(self) -> None:
        """Close the files."""
        with self._lock:
            for fd in [*self._fds.values(), *self._stale]:
                os.close(fd)
            self._fds.clear()
            self._stale.clear()
