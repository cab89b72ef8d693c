"""Command-line options: the core's flags, plugin flags, and the two-phase parse.

Plugin options can only be known after plugins load, and which plugins load is
itself a command-line choice. So, as pytest does, the command line is read
twice: first only the plugin-selection flags, then (with every plugin's
``mlxcore_addoption`` group added) the whole thing.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import mlxcore
from mlxcore.config import COMMON, ENGINE, HTTP, PARSERS, ServerConfig
from mlxcore.settings import add_flags


def add_plugin_selection(parser: argparse.ArgumentParser) -> None:
    """The flags that decide which plugins load (read in the first phase)."""
    group = parser.add_argument_group("plugins")
    group.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="NAME",
        help="enable a plugin by entry-point name or dotted module path (repeatable)",
    )
    group.add_argument(
        "--no-plugin",
        dest="blocked_plugins",
        action="append",
        default=[],
        metavar="NAME",
        help="block a plugin (installed or built-in) by name (repeatable)",
    )
    group.add_argument(
        "--disable-plugin-autoload",
        action="store_true",
        help="load only plugins named with --plugin (also MLXCORE_DISABLE_PLUGIN_AUTOLOAD=1)",
    )


def add_common(parser: argparse.ArgumentParser) -> None:
    """Flags every command takes."""
    add_flags(parser, ServerConfig, groups=(COMMON,))
    add_plugin_selection(parser)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Model and engine flags shared by ``serve``, ``generate`` and ``bench``, generated
    from :class:`ServerConfig`'s fields."""
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="local folder, Hugging Face repo id, or .gguf file (default: the embedded "
        "SmolLM2-135M-Instruct)",
    )
    groups = {name: parser.add_argument_group(name) for name in (ENGINE, PARSERS)}
    add_flags(parser, ServerConfig, groups=tuple(groups), containers=groups)


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """HTTP flags of ``serve``, generated from :class:`ServerConfig`'s fields."""
    groups = {HTTP: parser.add_argument_group(HTTP)}
    add_flags(parser, ServerConfig, groups=(HTTP,), containers=groups)


def config_from_args(args: argparse.Namespace, core_dests: set[str]) -> ServerConfig:
    """Build a :class:`ServerConfig`; flags the core does not know go to ``plugin_options``."""
    values = vars(args)
    fields = {f.name for f in ServerConfig.__attrs_attrs__}
    core: dict[str, Any] = {}
    for name in fields & values.keys():
        core[name] = values[name]
    plugin_options = {k: v for k, v in values.items() if k not in core_dests}
    return ServerConfig(**core, plugin_options=plugin_options)


def version_text() -> str:
    """``mlxcore --version`` output."""
    return f"mlxcore {mlxcore.__version__}"


def first_phase(argv: Sequence[str]) -> argparse.Namespace:
    """Read only the plugin-selection flags (and --log-level) from ``argv``."""
    pre = argparse.ArgumentParser(add_help=False)
    add_common(pre)
    args, _ = pre.parse_known_args(list(argv))
    return args
