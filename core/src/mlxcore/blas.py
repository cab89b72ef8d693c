"""Preloading the system OpenBLAS under MLX's CPU backend.

The Linux ``mlx[cpu]`` wheel links the reference BLAS, whose float32 ``sgemm`` is slow.
Preloading the system OpenBLAS (Debian package ``libopenblas0``) makes its ``cblas_*``
symbols win, which speeds up a float32 1024x1024 matmul by more than 30x on a 2-core x86
machine (357 ms -> 11 ms). Preloading only works at process start, so the CLI calls
:func:`reexec_with_openblas` first thing, before MLX is imported.

It also holds :func:`keep_float32_exact`, the other start-up choice about how float32
matrix products run (TF32 on tensor-core hardware). This module imports nothing heavy (no
MLX) so it can run before anything else.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
import os
import platform
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

#: Set in the re-executed process, so it never re-executes again.
REEXEC_ENV = "MLXCORE_OPENBLAS_REEXEC"
#: Set (to anything but "" or "0") to disable the preload.
DISABLE_ENV = "MLXCORE_NO_OPENBLAS"
#: Optional explicit path of the OpenBLAS library to preload.
PATH_ENV = "MLXCORE_OPENBLAS_PATH"

_LIB_NAMES = ("libopenblas.so.0", "libopenblasp.so.0", "libopenblas.so")


def _candidates() -> list[Path]:
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    triplets = [f"{arch}-linux-gnu", "x86_64-linux-gnu", "aarch64-linux-gnu"]
    if arch.startswith("arm") and arch != "arm64":
        triplets.insert(0, "arm-linux-gnueabihf")
    dirs = [Path("/usr/lib") / t for t in dict.fromkeys(triplets)]
    dirs += [d / "openblas-pthread" for d in dirs]
    dirs += [Path("/usr/lib64"), Path("/usr/lib"), Path("/usr/local/lib"), Path("/lib64")]
    return [d / name for d in dirs for name in _LIB_NAMES]


def openblas_path() -> Path | None:
    """The system OpenBLAS shared library to preload, or None (also None off Linux).

    ``$MLXCORE_OPENBLAS_PATH`` wins when it names an existing file; otherwise the Debian /
    Fedora locations for this machine's architecture are searched.
    """
    if not sys.platform.startswith("linux"):
        return None
    explicit = os.environ.get(PATH_ENV)
    if explicit:
        path = Path(explicit)
        return path if path.is_file() else None
    for path in _candidates():
        if path.is_file():
            return path
    return None


CUDA_WHEELS = ("mlx-cuda-12", "mlx-cuda-13")


@functools.cache
def cuda_backend() -> bool:
    """True when MLX runs on its CUDA backend here (an ``mlx-cuda-*`` wheel is installed):
    matmul is then the GPU's, and preloading OpenBLAS buys nothing."""
    for dist in CUDA_WHEELS:
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return True
    return False


def _preload_entries(env: Mapping[str, str]) -> list[str]:
    raw = env.get("LD_PRELOAD", "")
    return [e for e in raw.replace(" ", ":").split(":") if e]


def openblas_preloaded() -> bool:
    """True when an OpenBLAS is in ``LD_PRELOAD`` and (where visible) mapped into this process.

    ``/proc/self/maps`` is checked so a preload the dynamic loader ignored (missing file) does
    not count; a bundled, symbol-renamed OpenBLAS (numpy's) is not a preload and does not count.
    """
    entries = [e for e in _preload_entries(os.environ) if "openblas" in Path(e).name]
    if not entries:
        return False
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return True
    return any(os.path.realpath(e) in maps or e in maps for e in entries)


def reexec_env(env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The environment to re-execute with, or None when no re-exec is wanted.

    None when not on Linux, when OpenBLAS is missing or already preloaded (in ``env``; in
    this process too when ``env`` is None), when ``MLXCORE_NO_OPENBLAS`` is set, when MLX
    runs on CUDA, or when this process is itself the re-executed one.
    """
    source = dict(os.environ if env is None else env)
    if source.get(DISABLE_ENV, "") not in ("", "0") or source.get(REEXEC_ENV):
        return None
    if cuda_backend():
        return None
    lib = openblas_path()
    if lib is None:
        return None
    entries = _preload_entries(source)
    if any("openblas" in Path(e).name for e in entries) or (env is None and openblas_preloaded()):
        return None
    source["LD_PRELOAD"] = ":".join([*entries, str(lib)])
    source[REEXEC_ENV] = "1"
    return source


def reexec_with_openblas(argv: Sequence[str], *, command: Sequence[str] | None = None) -> None:
    """Re-execute this process with OpenBLAS preloaded, when that helps; else return.

    Args:
        argv: the arguments to pass on (usually ``sys.argv[1:]``).
        command: the program to run before ``argv``; defaults to
            ``[sys.executable, "-m", "mlxcore"]``.

    On success this never returns (``os.execve`` replaces the process). The new process gets
    ``LD_PRELOAD`` (appended to any existing value) and ``MLXCORE_OPENBLAS_REEXEC=1``.
    """
    env = reexec_env()
    if env is None:
        return
    program = list(command) if command is not None else [sys.executable, "-m", "mlxcore"]
    args = [*program, *argv]
    logger.debug("re-executing with LD_PRELOAD=%s", env["LD_PRELOAD"])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    try:
        if os.path.isabs(args[0]):
            os.execve(args[0], args, env)
        else:
            os.execvpe(args[0], args, env)
    except OSError as exc:  # keep running without OpenBLAS rather than fail
        logger.warning("could not re-execute with OpenBLAS preloaded: %s", exc)


def log_blas_status() -> None:
    """Say in the start-up log whether float32 matmul runs on OpenBLAS."""
    if openblas_preloaded():
        logger.info("OpenBLAS preloaded: float32 matmul uses %s", openblas_path())
    elif sys.platform.startswith("linux"):
        reason = (
            "MLXCORE_NO_OPENBLAS is set"
            if os.environ.get("MLXCORE_NO_OPENBLAS")
            else ("libopenblas0 is not installed (make setup installs it when run as root)")
        )
        logger.info("OpenBLAS not in use (%s): float32 matmul uses the reference BLAS", reason)


#: MLX's switch for reduced-precision (TF32) float32 matrix products; read once, lazily.
TF32_ENV = "MLX_ENABLE_TF32"


def keep_float32_exact(env: MutableMapping[str, str] | None = None) -> bool:
    """Ask MLX for full-precision float32 matrix products unless ``MLX_ENABLE_TF32`` is set.

    MLX's default lets tensor-core hardware (NVIDIA GPUs under the CUDA backend, Apple M5
    neural accelerators) multiply float32 matrices in TF32, about 1e-3 relative, while a
    one-row product (a single stream's decode step) stays full float32. A float32 model's
    greedy tokens would then depend on how many rows shared a step, which breaks their
    identity with ``mlx_lm.generate``. bfloat16, float16 and quantized models are not
    affected. MLX reads the variable at its first matrix product, so this runs at start-up;
    a value the user set (``MLX_ENABLE_TF32=1`` for speed) is left alone.

    Returns:
        True when it set the variable (in ``env``, default ``os.environ``).
    """
    target = os.environ if env is None else env
    if TF32_ENV in target:
        return False
    target[TF32_ENV] = "0"
    return True
