"""Turn what the user asked for into a local MLX model folder.

``resolve_model`` accepts a local folder (with ``config.json``), a Hugging Face repo id
(``owner/name``, fetched with ``huggingface_hub.snapshot_download`` into the standard HF
cache) or a llama-family ``.gguf`` file (checked, then converted once into
``$MLXCORE_HOME/models``). The folder is checked with :func:`check_model_folder` before
anything is loaded.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path

import attrs

from mlxcore.errors import ModelLoadError
from mlxcore.models.folder import check_fits_in_memory, check_model_folder

logger = logging.getLogger(__name__)

#: Files fetched from a Hugging Face repo (weights, configs, tokenizer, chat template).
HF_ALLOW_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TRUE = {"1", "true", "yes", "on"}
#: Bumped when the GGUF converter's output changes, so old cache entries are not reused.
GGUF_CACHE_VERSION = 1


@attrs.frozen
class ResolvedModel:
    """A model available as a local MLX folder.

    Attributes:
        path: the local folder holding ``config.json``, the weights and the tokenizer.
        source: what the user asked for (the folder, repo id or GGUF path as given).
        kind: ``"folder"``, ``"hf"`` or ``"gguf"``.
        converted: True when this call converted a GGUF file (False when it reused the cache).
    """

    path: Path
    source: str
    kind: str = "folder"
    converted: bool = False


def mlxcore_home() -> Path:
    """The mlxcore cache root: ``$MLXCORE_HOME``, defaulting to ``~/.cache/mlxcore``."""
    env = os.environ.get("MLXCORE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mlxcore"


def default_models_dir() -> Path:
    """Where converted and built-in models are cached: ``$MLXCORE_HOME/models``."""
    return mlxcore_home() / "models"


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def resolve_model(
    arg: str | os.PathLike[str],
    *,
    cache_dir: Path | None = None,
    gguf_dtype: str | None = None,
    check_memory: bool = True,
    architectures: Collection[str] = (),
) -> ResolvedModel:
    """Resolve ``arg`` (folder, ``owner/name`` repo id or ``.gguf`` file) to a local folder.

    Args:
        arg: what the user asked for.
        cache_dir: where GGUF conversions are cached (default ``$MLXCORE_HOME/models``).
        gguf_dtype: the storage type for a GGUF conversion (see :func:`convert_gguf`).
        check_memory: refuse weights that clearly do not fit in memory
            (also disabled by ``MLXCORE_SKIP_MEMORY_CHECK=1``).
        architectures: checkpoint architectures that plugins load without mlx-lm
            (``mlxcore_model_architectures``): accepted by the folder check.

    Raises:
        ModelLoadError: naming the path or repo, when the model cannot be made available.
    """
    source = os.fspath(arg)
    path = Path(source).expanduser()
    check_mem = check_memory and not _env_true("MLXCORE_SKIP_MEMORY_CHECK")
    if path.suffix.lower() == ".gguf":
        return _resolve_gguf(path, source, cache_dir, gguf_dtype, check_mem)
    if path.exists() or source.startswith((".", "/", "~")) or not _REPO_ID.match(source):
        if not path.exists():
            raise ModelLoadError(f"model folder {path} does not exist")
        if not path.is_dir():
            raise ModelLoadError(f"{path} is not a model folder nor a .gguf file")
        check_model_folder(path, check_memory=check_mem, architectures=architectures)
        return ResolvedModel(path=path.resolve(), source=source, kind="folder")
    folder = _download_repo(source)
    check_model_folder(folder, check_memory=check_mem, architectures=architectures)
    return ResolvedModel(path=folder, source=source, kind="hf")


# --------------------------------------------------------------------------- Hugging Face


def _download_repo(repo_id: str) -> Path:
    """Fetch ``repo_id`` into the standard HF cache (or find it there when offline)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")
    if not offline:
        here = _downloaded(repo_id)
        if here is not None:
            return here
    try:
        # offline, or the Hub out of reach (the download said 503): the cache has the
        # last word
        folder = snapshot_download(repo_id, allow_patterns=HF_ALLOW_PATTERNS, local_files_only=True)
    except LocalEntryNotFoundError as exc:
        why = (
            "offline mode is on (HF_HUB_OFFLINE=1)"
            if offline
            else "the Hugging Face Hub cannot be reached"
        )
        raise ModelLoadError(
            f"cannot get Hugging Face repo {repo_id}: {why} and it is not in the local "
            "Hugging Face cache; download it on a connected machine or pass a local folder"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot read Hugging Face repo {repo_id} from the cache: {exc}"
        ) from exc
    return Path(folder)


def _downloaded(repo_id: str) -> Path | None:
    """``repo_id`` from the cache when whole there, else downloaded (resuming a download
    cut short: :mod:`mlxcore.models.download`), or ``None`` when the Hub cannot be
    reached (the caller falls back on whatever the cache has)."""
    from mlxcore.models.download import DownloadError, cached_or_downloaded

    try:
        return cached_or_downloaded(repo_id, HF_ALLOW_PATTERNS)[0]
    except DownloadError as exc:
        if exc.status == 404:
            raise ModelLoadError(
                f"Hugging Face repo {repo_id} was not found (or is private or gated; set "
                "HF_TOKEN and accept its terms), and it is not a local folder"
            ) from exc
        if exc.status == 503:
            return None
        raise


# --------------------------------------------------------------------------- GGUF


def gguf_cache_key(gguf_path: Path, dtype: str) -> str:
    """A short key naming one conversion of ``gguf_path`` (its path, size, mtime and dtype)."""
    st = gguf_path.stat()
    ident = f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{dtype}|v{GGUF_CACHE_VERSION}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _resolve_gguf(
    path: Path, source: str, cache_dir: Path | None, dtype: str | None, check_memory: bool
) -> ResolvedModel:
    from mlxcore.models.gguf import DEFAULT_DTYPE

    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} does not exist")
    dtype = dtype or DEFAULT_DTYPE
    cache = (cache_dir or default_models_dir()).expanduser()
    target = cache / f"{path.stem}-{dtype}-{gguf_cache_key(path, dtype)}"
    converted = False
    if not (target / "config.json").is_file():
        if check_memory:
            check_fits_in_memory(path.stat().st_size, path)
        convert_to_cache(path, target, dtype=dtype)
        converted = True
    else:
        logger.info("reusing converted GGUF %s", target)
    check_model_folder(target, check_memory=check_memory)
    return ResolvedModel(path=target, source=source, kind="gguf", converted=converted)


def convert_to_cache(gguf_path: Path, target: Path, *, dtype: str) -> Path:
    """Convert ``gguf_path`` into ``target`` atomically (temp folder, then rename)."""
    from mlxcore.models.gguf import convert_gguf

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        logger.info("converting %s into %s", gguf_path, target)
        convert_gguf(gguf_path, tmp, dtype=dtype)
        if target.exists() and not (target / "config.json").is_file():
            shutil.rmtree(target)  # a broken leftover: never a finished conversion
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            logger.info("another process converted %s first", gguf_path)
    except OSError as exc:
        raise ModelLoadError(
            f"cannot write the conversion of {gguf_path} to {target}: {exc}"
        ) from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
