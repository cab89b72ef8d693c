"""The models on this machine: fetch, list, inspect, quantize and remove them.

Two places hold models: the Hugging Face cache (what ``mlxcore models pull`` and
``mlxcore serve owner/name`` download, with ``huggingface_hub``: resumable, honouring
``HF_ENDPOINT``, ``HF_HOME`` and ``HF_TOKEN``) and ``$MLXCORE_HOME/models`` (the embedded
default model, GGUF conversions and what ``mlxcore models quantize`` writes). Every
function here works on the files alone; the CLI (:mod:`mlxcore.cli.models_command`)
asks a running server whether a model is loaded before removing it.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from mlxcore.errors import ModelLoadError
from mlxcore.models.download import Progress, cached_or_downloaded
from mlxcore.models.folder import is_complete, read_config
from mlxcore.models.resolve import HF_ALLOW_PATTERNS, default_models_dir

log = logging.getLogger(__name__)

RECIPES = ("mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6")
"""mlx-lm's mixed-precision quantization recipes (``mlx_lm.convert``'s
``quant_predicate``): more bits for the layers that matter most."""
BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)


@attrs.frozen
class LocalModel:
    """One model on this machine.

    Attributes:
        name: what to pass to ``mlxcore serve`` (a repo id, or the folder's name under
            ``$MLXCORE_HOME/models``).
        path: the folder with ``config.json`` and the weights.
        where: ``"hf-cache"`` or ``"mlxcore"``.
        size: bytes on disk.
        config: the folder's ``config.json`` (empty when unreadable).
        complete: every file a model needs is there (no download left half done).
        repo_path: the Hugging Face cache's folder of the repo (removed whole by
            :func:`remove`), else ``path``.
    """

    name: str
    path: Path
    where: str
    size: int
    config: dict[str, Any] = attrs.field(repr=False)
    complete: bool
    repo_path: Path

    @property
    def architecture(self) -> str:
        """``config.json``'s ``model_type`` (``""`` when unknown)."""
        return str(self.config.get("model_type", ""))

    @property
    def quantization(self) -> str:
        """``4-bit g64``, a mixed recipe's bit widths, or the float type of the weights."""
        quant = self.config.get("quantization") or self.config.get("quantization_config")
        if isinstance(quant, dict) and isinstance(quant.get("bits"), int):
            mode = quant.get("mode", "affine")
            text = f"{quant['bits']}-bit g{quant.get('group_size', '?')}"
            widths = sorted(
                {v["bits"] for v in quant.values() if isinstance(v, dict) and "bits" in v}
            )
            if len(widths) > 1:
                text = "mixed " + "/".join(str(b) for b in widths) + "-bit"
            return text if mode == "affine" else f"{text} {mode}"
        dtype = self.config.get("torch_dtype") or self.config.get("dtype")
        return str(dtype) if dtype else "float"

    @property
    def served_by(self) -> list[str]:
        """What serves it: ``core`` (an mlx-lm architecture) and the plugins its files
        call for (a best guess from ``config.json``; ``mlxcore plugins`` lists what is
        installed)."""
        return served_by(self.config)


def served_by(config: dict[str, Any]) -> list[str]:
    """The core and the plugins a model with ``config`` needs (see
    :attr:`LocalModel.served_by`)."""
    import importlib.util

    kind = str(config.get("model_type", ""))
    found = []
    if kind and importlib.util.find_spec(f"mlx_lm.models.{kind.replace('-', '_')}"):
        found.append("core")
    if "vision_config" in config:
        found.append("vision")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if kind.startswith("qwen3_5") and isinstance(text, dict) and text.get("mtp_num_hidden_layers"):
        found.append("qwen35-mtp")
    if kind == "whisper" or "audio_config" in config:
        found.append("audio")
    if kind in ("bert", "xlm-roberta", "modernbert") or "Reranker" in str(
        config.get("_name_or_path")
    ):
        found.append("rerank")
    return found


def _folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _config(path: Path) -> dict[str, Any]:
    try:
        return read_config(path)
    except ModelLoadError:
        return {}


def _hf_models() -> Iterator[LocalModel]:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        return
    for repo in cache.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        latest = max(repo.revisions, key=lambda r: r.last_modified)
        path = Path(latest.snapshot_path)
        if not (path / "config.json").is_file():
            continue
        yield LocalModel(
            repo.repo_id,
            path,
            "hf-cache",
            repo.size_on_disk,
            _config(path),
            is_complete(path),
            Path(repo.repo_path),
        )


def _own_models() -> Iterator[LocalModel]:
    root = default_models_dir()
    if not root.is_dir():
        return
    for path in sorted(p for p in root.iterdir() if (p / "config.json").is_file()):
        yield LocalModel(
            path.name, path, "mlxcore", _folder_size(path), _config(path), is_complete(path), path
        )


def list_models() -> list[LocalModel]:
    """Every model in the Hugging Face cache and under ``$MLXCORE_HOME/models``."""
    return sorted([*_hf_models(), *_own_models()], key=lambda m: m.name.lower())


def find(name: str) -> LocalModel:
    """The local model ``name`` (a repo id, a folder name under ``$MLXCORE_HOME/models``
    or a folder path); :class:`ModelLoadError` listing the names when there is none."""
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return LocalModel(
            str(path), path, "folder", _folder_size(path), _config(path), is_complete(path), path
        )
    models = list_models()
    for model in models:
        if model.name == name:
            return model
    known = ", ".join(m.name for m in models) or "none"
    raise ModelLoadError(f"no local model {name!r} (models here: {known})")


def pull(
    repo_id: str, *, progress: bool = True, on_progress: Progress | None = None
) -> tuple[Path, bool]:
    """Download ``repo_id`` into the Hugging Face cache; return its folder and whether
    anything was fetched. A model already there whole is not asked for again (no
    network at all); a download cut short resumes where it stopped
    (:mod:`mlxcore.models.download`)."""
    folder, fetched = cached_or_downloaded(
        repo_id, HF_ALLOW_PATTERNS, progress=progress, on_progress=on_progress
    )
    if not is_complete(folder):
        raise ModelLoadError(f"{repo_id} has no complete MLX model (config, tokenizer, weights)")
    return folder, fetched


def remove(model: LocalModel) -> int:
    """Delete ``model``'s files (a Hugging Face repo: every revision); the bytes freed."""
    if model.where == "folder":
        raise ModelLoadError(
            f"{model.path} is a folder of yours, not a managed model; delete it yourself"
        )
    size = _folder_size(model.repo_path) if model.repo_path.exists() else 0
    shutil.rmtree(model.repo_path)
    return size


def quantize(
    source: LocalModel,
    out: Path | None = None,
    *,
    bits: int = 4,
    group_size: int = 64,
    recipe: str | None = None,
    report: Callable[[str], None] = log.info,
) -> Path:
    """Write a quantized copy of ``source`` with mlx-lm's converter: ``bits`` and
    ``group_size``, or a mixed ``recipe`` (:data:`RECIPES`); into ``out``, by default
    ``$MLXCORE_HOME/models/NAME-4bit`` (``-mixed_3_6``). The copy is written beside its
    final place and moved there whole, so a failed run leaves nothing behind."""
    from mlx_lm import convert

    if bits not in BITS:
        raise ValueError(f"bits must be one of {', '.join(map(str, BITS))}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group size must be one of {', '.join(map(str, GROUP_SIZES))}")
    if recipe is not None and recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}")
    if source.config.get("quantization"):
        raise ValueError(f"{source.name} is already quantized ({source.quantization})")
    label = recipe or f"{bits}bit"
    target = out or default_models_dir() / f"{source.name.rsplit('/', 1)[-1]}-{label}"
    if target.exists():
        raise ValueError(f"{target} already exists")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    report(f"quantizing {source.name} to {label} (group size {group_size}) into {target}")
    try:
        convert(
            str(source.path),
            str(partial),
            quantize=True,
            q_bits=bits,
            q_group_size=group_size,
            quant_predicate=recipe,
        )
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target
