"""Small real models built on the fly, for tests.

:func:`build_test_model` writes a local model folder that ``mlx_lm.load`` loads unchanged:
``config.json``, ``model.safetensors`` (seeded random float32 weights of the real mlx-lm
model class), the family's real tokenizer and its official chat template. Builds are
cached by a hash of their arguments, so the second call returns at once, and are safe to
run from several processes at the same time (pytest-xdist): a file lock keeps the work to
one process and the finished folder appears by an atomic rename.

Nothing here is mocked: tests load these folders with the real loader and run real MLX.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import lzma
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from mlxcore.testing.model_specs import (
    BUILDER_VERSION,
    MODEL_SPECS,
    ModelSpec,
    TokenIds,
    TokenizerFamily,
    available_architectures,
)

try:  # POSIX only; without it concurrent builders may duplicate work, never corrupt it.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

MANIFEST_NAME = ".mlxcore-test-model.json"
"""Written last into every built folder: what was built, from which arguments."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def default_test_models_root() -> Path:
    """Where built models are cached when ``build_test_model`` gets no ``root``.

    ``$MLXCORE_TEST_MODELS`` if set, otherwise ``$MLXCORE_HOME/test-models`` with
    ``MLXCORE_HOME`` defaulting to ``~/.cache/mlxcore``.
    """
    explicit = os.environ.get("MLXCORE_TEST_MODELS")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("MLXCORE_HOME") or "~/.cache/mlxcore"
    return Path(home).expanduser() / "test-models"


def model_cache_key(
    arch: str, *, size: str = "tiny", seed: int = 0, **config_overrides: Any
) -> str:
    """The cache folder name of a build: readable prefix plus a hash of every argument."""
    _spec_for(arch, size)
    try:
        payload = json.dumps(
            {
                "builder_version": BUILDER_VERSION,
                "arch": arch,
                "size": size,
                "seed": seed,
                "overrides": config_overrides,
            },
            sort_keys=True,
        )
    except TypeError as exc:
        raise ValueError(f"config overrides must be JSON-serialisable: {exc}") from exc
    digest = hashlib.sha256(payload.encode()).hexdigest()[:16]
    return f"{arch}-{size}-seed{seed}-{digest}"


def build_test_model(
    arch: str,
    *,
    root: Path | None = None,
    seed: int = 0,
    size: str = "tiny",
    **config_overrides: Any,
) -> Path:
    """Build (or reuse) a small real model and return its local folder.

    Args:
        arch: a registered architecture: ``"llama"``, ``"qwen3"``, ``"qwen3_5"``,
            ``"gemma4_text"`` (see :func:`available_architectures`).
        root: cache folder; defaults to :func:`default_test_models_root`.
        seed: ``mx.random.seed`` used before instantiating the model; the same arguments
            always give the same weights. A build reseeds MLX's global generator.
        size: ``"tiny"`` (hidden 64, 2-4 layers) or ``"small"`` (hidden 512, ~10x params).
        **config_overrides: fields of the (text) config to change, e.g.
            ``num_hidden_layers=3``; they are part of the cache key.

    Returns:
        The folder, loadable by ``mlx_lm.load(path)``.
    """
    spec = _spec_for(arch, size)
    name = model_cache_key(arch, size=size, seed=seed, **config_overrides)
    base = Path(root).expanduser() if root is not None else default_test_models_root()
    return build_folder_once(
        base,
        name,
        lambda tmp: _build_into(tmp, spec, size=size, seed=seed, overrides=config_overrides),
    )


def build_folder_once(
    base: Path, name: str, build: Callable[[Path], None], manifest: str = MANIFEST_NAME
) -> Path:
    """``base / name``, built by ``build(folder)`` unless a complete one exists.

    ``build`` fills a private temporary folder and must write ``manifest`` last; the
    folder then appears by an atomic rename. A file lock makes concurrent builders
    (pytest-xdist workers, parallel CI jobs) wait for one build; folders without a
    manifest and leftovers of killed builds are removed.
    """
    target = base / name
    if (target / manifest).is_file():
        return target
    base.mkdir(parents=True, exist_ok=True)
    with _build_lock(base / f".{name}.lock"):
        if (target / manifest).is_file():  # another process built it while we waited
            return target
        if target.exists():  # a folder without manifest is not ours to trust
            logger.warning("removing incomplete test model folder %s", target)
            shutil.rmtree(target, ignore_errors=True)
        for stale in base.glob(f".{name}.tmp-*"):  # left by a killed build; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=base))
        try:
            os.chmod(tmp, 0o777 & ~_current_umask())  # mkdtemp makes it private (0700)
            build(tmp)
            try:
                os.rename(tmp, target)
            except OSError:
                if not (target / manifest).is_file():
                    raise
                # Someone without the lock (another OS) finished first: theirs is as good.
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _spec_for(arch: str, size: str) -> ModelSpec:
    spec = MODEL_SPECS.get(arch)
    if spec is None:
        raise ValueError(f"unknown test-model arch {arch!r}; known: {available_architectures()}")
    if size not in spec.sizes:
        raise ValueError(f"arch {arch!r} has no size {size!r}; known: {sorted(spec.sizes)}")
    return spec


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _build_into(
    folder: Path, spec: ModelSpec, *, size: str, seed: int, overrides: dict[str, Any]
) -> None:
    import importlib
    import importlib.metadata

    import mlx.core as mx
    from mlx.utils import tree_flatten

    started = time.perf_counter()
    logger.info("building test model %s/%s seed=%d in %s", spec.arch, size, seed, folder)

    ids = _write_tokenizer(spec.tokenizer, folder)
    (folder / "chat_template.jinja").write_text(asset_text("chat-templates", spec.chat_template))

    fields = {**spec.sizes[size], **overrides}
    fields.setdefault("vocab_size", ids.vocab_len)
    if int(fields["vocab_size"]) < ids.vocab_len:
        raise ValueError(
            f"vocab_size={fields['vocab_size']} is smaller than the tokenizer ({ids.vocab_len})"
        )
    config = spec.make_config(fields, ids)
    _write_json(folder / "config.json", config)
    generation_config = {
        k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config
    }
    _write_json(folder / "generation_config.json", generation_config)

    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    # Reseeds MLX's global generator (it cannot be saved and restored).
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    if spec.export_weights is not None:
        tensors = spec.export_weights(model, config)
    else:
        tensors = dict(tree_flatten(model.parameters()))
    tensors = {k: v.astype(mx.float32) for k, v in tensors.items()}
    mx.eval(tensors)
    mx.save_safetensors(str(folder / "model.safetensors"), tensors, metadata={"format": "pt"})

    num_params = sum(int(v.size) for v in tensors.values())
    manifest = {
        "builder_version": BUILDER_VERSION,
        "arch": spec.arch,
        "size": size,
        "seed": seed,
        "overrides": overrides,
        "num_parameters": num_params,
        "safetensors_bytes": (folder / "model.safetensors").stat().st_size,
        "build_seconds": round(time.perf_counter() - started, 3),
        "mlx_version": importlib.metadata.version("mlx"),
    }
    _write_json(folder / MANIFEST_NAME, manifest)
    logger.info(
        "built test model %s/%s (%.1fM params) in %.2fs",
        spec.arch,
        size,
        num_params / 1e6,
        manifest["build_seconds"],
    )


def _write_tokenizer(family: TokenizerFamily, folder: Path) -> TokenIds:
    """Copy the family's tokenizer into ``folder`` (adding its special tokens); return ids."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer_json = asset_text(family.asset_dir, "tokenizer.json")
    tokenizer = Tokenizer.from_str(tokenizer_json)
    new_tokens = [t for t in family.added_special_tokens if tokenizer.token_to_id(t) is None]
    if new_tokens:
        tokenizer.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in new_tokens]
        )
        tokenizer_json = tokenizer.to_str(pretty=True)
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")

    tokenizer_config = json.loads(asset_text(family.asset_dir, "tokenizer_config.json"))
    tokenizer_config.pop("chat_template", None)  # the template is chat_template.jinja
    decoder = tokenizer_config.setdefault("added_tokens_decoder", {})
    for token in new_tokens:
        decoder[str(tokenizer.token_to_id(token))] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    for key, value in family.config_updates.items():
        if value is None:
            tokenizer_config.pop(key, None)
        else:
            tokenizer_config[key] = value
    _write_json(folder / "tokenizer_config.json", tokenizer_config)

    def token_id(token: str) -> int:
        found = tokenizer.token_to_id(token)
        if found is None:
            raise ValueError(f"{family.name} tokenizer has no token {token!r}")
        return int(found)

    return TokenIds(
        vocab_len=tokenizer.get_vocab_size(with_added_tokens=True),
        eos=tuple(token_id(t) for t in family.eos_tokens),
        bos=token_id(family.bos_token) if family.bos_token else None,
        pad=token_id(family.pad_token) if family.pad_token else None,
    )


def asset_text(folder: str, name: str) -> str:
    """Read ``assets/<folder>/<name>``, or its ``.xz``-compressed copy."""
    base = resources.files("mlxcore.testing").joinpath("assets", folder)
    plain = base.joinpath(name)
    if plain.is_file():
        return plain.read_text(encoding="utf-8")
    packed = base.joinpath(name + ".xz")
    if packed.is_file():
        return lzma.decompress(packed.read_bytes()).decode("utf-8")
    raise FileNotFoundError(f"mlxcore.testing asset {folder}/{name} is missing")


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def read_manifest(folder: Path) -> dict[str, Any]:
    """The build record of a folder made by :func:`build_test_model`."""
    return json.loads((Path(folder) / MANIFEST_NAME).read_text(encoding="utf-8"))


__all__ = [
    "MANIFEST_NAME",
    "build_folder_once",
    "build_test_model",
    "default_test_models_root",
    "model_cache_key",
    "read_manifest",
]
