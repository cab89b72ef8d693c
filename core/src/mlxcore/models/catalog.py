"""Which models a server serves: ``--model [NAME=]SOURCE`` and ``--models-config FILE``.

This module reads what the user wrote into :class:`CatalogEntry` objects (plain data,
checked for shape); :mod:`mlxcore.cli.model_specs` turns each into a
:class:`ModelSpec`, with that model's own configuration and plugins, for the router.

A models file is TOML; each ``[models.NAME]`` table is one model (its key is the name
clients use)::

    memory_budget = "12GB"          # optional: --models-memory-budget
    idle_unload = 900               # optional: --idle-unload

    [models.qwen]
    source = "~/models/Qwen3.5-9B-4bit"   # a folder, a repo id or a .gguf file
    aliases = ["gpt-4o", "main"]
    plugins = ["qwen35-mtp"]
    pinned = true                         # never unloaded
    max-num-seqs = 16                     # any engine / parser flag of `mlxcore serve`,
    context-length = 32768                # (= max-model-len) and any plugin flag

    [models.embed]
    source = "~/models/Qwen3-Embedding-0.6B"
    task = "embed"                        # serves /v1/embeddings only
    pooling = "last"                      # last token (default) or mean

    [models.rerank]
    source = "~/models/Qwen3-Reranker-0.6B"
    task = "rerank"                       # serves /v1/rerank and /score (rerank plugin)

    [models.whisper]
    source = "~/models/whisper-large-v3-turbo"
    task = "stt"                          # /v1/audio/transcriptions, /translations (audio plugin)

    [models.voice]
    source = "~/models/Kokoro-82M"
    task = "tts"                          # /v1/audio/speech (audio plugin)
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from mlxcore.errors import UsageError

if TYPE_CHECKING:
    from mlxcore.config import ServerConfig
    from mlxcore.hooks import PluginHooks

TASKS = ("generate", "embed", "rerank", "stt", "tts")
POOLINGS = ("last", "mean")
FLAG_ALIASES = {"context-length": "max-model-len"}
"""Friendlier names accepted in a models file for some flags."""
RESERVED = frozenset(
    {"source", "aliases", "plugins", "pinned", "idle-unload", "task", "pooling", "options"}
)


@attrs.frozen
class CatalogEntry:
    """One model as the user described it (not yet loaded, not yet configured).

    Attributes:
        name: the name clients use (the ``[models.NAME]`` key or ``NAME=``).
        source: a folder, a Hub repo id or a .gguf file (``None``: the embedded default).
        aliases: other names that reach this model.
        plugins: plugins enabled for this model only (besides the server's).
        pinned: never unloaded to make room or when idle.
        idle_unload: seconds unused before it is unloaded (``None``: the server's).
        task: ``generate`` (chat, completions...), ``embed`` (``/v1/embeddings`` only) or
            ``rerank`` (``/v1/rerank`` and ``/score``, from the rerank plugin) , ``stt``
            (``/v1/audio/transcriptions`` and ``/translations``, from the audio plugin) or
            ``tts`` (``/v1/audio/speech``, from the audio plugin).
        pooling: how an embedding is taken from the hidden states: ``last`` or ``mean``.
        flags: this model's own command-line flags, e.g. ``("--max-num-seqs", "16")``.
    """

    name: str
    source: str | None
    aliases: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()
    pinned: bool = False
    idle_unload: float | None = None
    task: str = "generate"
    pooling: str = "last"
    flags: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The name first, then the aliases."""
        return (self.name, *self.aliases)


@attrs.frozen
class ModelSpec:
    """A configured model: its entry, its own server configuration and plugins."""

    entry: CatalogEntry
    config: ServerConfig
    hooks: PluginHooks

    @property
    def name(self) -> str:
        """The name clients use."""
        return self.entry.name

    @property
    def names(self) -> tuple[str, ...]:
        """Every name that reaches this model (the name first)."""
        return self.entry.names


@attrs.frozen
class Catalog:
    """Every model of a models file, and its server-wide settings."""

    entries: tuple[CatalogEntry, ...]
    memory_budget: str | int | None = None
    idle_unload: float | None = None


def parse_model_arg(text: str) -> CatalogEntry:
    """``--model NAME=SOURCE`` or ``--model SOURCE`` (named after the folder or repo)."""
    from mlxcore.models.names import model_name

    name, sep, source = text.partition("=")
    if not sep:
        name, source = model_name(text), text
    name, source = name.strip(), source.strip()
    if not name or not source:
        raise UsageError(f"--model {text!r}: expected [NAME=]SOURCE")
    return CatalogEntry(name=name, source=source)


def read_catalog(path: str | Path) -> Catalog:
    """Read a models file (see the module docstring); a mistake is a :class:`UsageError`
    naming the file and the model."""
    file = Path(path).expanduser()
    try:
        document = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--models-config {path}: cannot read it: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--models-config {path}: not valid TOML: {exc}") from None
    unknown = set(document) - {"models", "memory_budget", "idle_unload"}
    if unknown:
        raise UsageError(f"--models-config {path}: unknown setting(s) {', '.join(sorted(unknown))}")
    models = document.get("models")
    if not isinstance(models, dict) or not models:
        raise UsageError(f"--models-config {path}: no [models.NAME] tables")
    entries = tuple(
        _entry(name, table, f"{path}: [models.{name}]") for name, table in models.items()
    )
    idle = document.get("idle_unload")
    if idle is not None and (
        isinstance(idle, bool) or not isinstance(idle, int | float) or idle < 0
    ):
        raise UsageError(f"--models-config {path}: idle_unload must be seconds >= 0")
    budget = document.get("memory_budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, str | int)):
        raise UsageError(f"--models-config {path}: memory_budget must be a size such as 12GB")
    return Catalog(entries, budget, float(idle) if idle is not None else None)


def _entry(name: str, table: Any, where: str) -> CatalogEntry:
    if not isinstance(table, dict):
        raise UsageError(f"{where} must be a table")
    values = {key.replace("_", "-"): value for key, value in table.items()}
    source = values.get("source")
    if not isinstance(source, str) or not source.strip():
        raise UsageError(f'{where}: source = "<folder, repo id or .gguf file>" is required')
    aliases = _strings(values.get("aliases", []), f"{where}: aliases")
    plugins = _strings(values.get("plugins", []), f"{where}: plugins")
    pinned = values.get("pinned", False)
    if not isinstance(pinned, bool):
        raise UsageError(f"{where}: pinned must be true or false")
    idle = values.get("idle-unload")
    if idle is not None and (
        isinstance(idle, bool) or not isinstance(idle, int | float) or idle < 0
    ):
        raise UsageError(f"{where}: idle_unload must be seconds >= 0")
    task = values.get("task", "generate")
    if task not in TASKS:
        raise UsageError(f"{where}: task must be one of {', '.join(TASKS)}, got {task!r}")
    pooling = values.get("pooling", "last")
    if pooling not in POOLINGS:
        raise UsageError(f"{where}: pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    options = values.get("options", {})
    if not isinstance(options, dict):
        raise UsageError(f"{where}: options must be a table of flags")
    rest = {k: v for k, v in values.items() if k not in RESERVED}
    flags = as_flags({**rest, **{k.replace("_", "-"): v for k, v in options.items()}}, where)
    return CatalogEntry(
        name=name,
        source=source.strip(),
        aliases=aliases,
        plugins=plugins,
        pinned=pinned,
        idle_unload=float(idle) if idle is not None else None,
        task=task,
        pooling=pooling,
        flags=flags,
    )


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise UsageError(f"{where} must be a list of names")
    return tuple(v.strip() for v in value)


def as_flags(values: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """``{"max-num-seqs": 16, "trust-x": true}`` as ``("--max-num-seqs", "16", "--trust-x")``
    (``false`` leaves a switch out; a list repeats the values after one flag)."""
    argv: list[str] = []
    for key, value in values.items():
        flag = "--" + FLAG_ALIASES.get(key, key)
        if isinstance(value, bool):
            if value:
                argv.append(flag)
        elif isinstance(value, int | float | str):
            argv += [flag, str(value)]
        elif isinstance(value, list) and all(isinstance(v, int | float | str) for v in value):
            argv += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            import json

            argv += [flag, json.dumps(value)]
        else:
            raise UsageError(f"{where}: {key} has a value of an unsupported type")
    return tuple(argv)
