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
from mlxcore.config import ServerConfig

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _log_level(text: str) -> str:
    value = text.strip().lower()
    if value not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid log level {text!r} (choose from {', '.join(LOG_LEVELS)}; any case)"
        )
    return value


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
    parser.add_argument(
        "--log-level",
        type=_log_level,
        default="info",
        help="log level for mlxcore and uvicorn: critical, error, warning, info, debug (any case)",
    )
    add_plugin_selection(parser)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Model and engine flags shared by ``serve``, ``generate`` and ``bench``."""
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="local folder, Hugging Face repo id, or .gguf file (default: the embedded "
        "SmolLM2-135M-Instruct)",
    )
    engine = parser.add_argument_group("engine")
    engine.add_argument(
        "--max-num-seqs", type=_positive, default=16, help="most sequences decoded together"
    )
    engine.add_argument(
        "--max-queue-size", type=_positive, default=256, help="most requests waiting"
    )
    engine.add_argument(
        "--max-model-len", type=_positive, default=None, help="context length limit"
    )
    engine.add_argument(
        "--prefill-step-size", type=_positive, default=2048, help="prefill chunk size"
    )
    engine.add_argument(
        "--prefill-batch-size",
        type=_positive,
        default=8,
        help="most waiting prompts prefilled together in one forward pass (1: one at a time)",
    )
    engine.add_argument(
        "--prefix-cache-size",
        default="32768",
        help="prefix cache budget: tokens (e.g. 32768) or a size (e.g. 512MB); 0 disables",
    )
    engine.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="fraction of memory MLX may use (vLLM's name)",
    )
    engine.add_argument(
        "--cache-strategy", default=None, metavar="NAME", help="pick a cache strategy by name"
    )
    engine.add_argument(
        "--prefill-strategy", default=None, metavar="NAME", help="pick a prefill strategy by name"
    )
    engine.add_argument("--decoder", default=None, metavar="NAME", help="pick a decoder by name")
    parsers = parser.add_argument_group("parsers")
    parsers.add_argument(
        "--tool-call-parser", default="auto", metavar="NAME", help="tool-call parser name, or auto"
    )
    parsers.add_argument(
        "--reasoning-parser", default="auto", metavar="NAME", help="reasoning parser name, or auto"
    )


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """HTTP flags of ``serve``."""
    http = parser.add_argument_group("http")
    http.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    http.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    http.add_argument(
        "--served-model-name",
        nargs="+",
        default=[],
        metavar="NAME",
        help="model name(s) clients use (default: the model argument)",
    )
    http.add_argument(
        "--api-key", default=None, help="require this Bearer key on every route but /health"
    )
    http.add_argument(
        "--allowed-origins",
        nargs="+",
        default=[],
        metavar="ORIGIN",
        help="enable CORS for these origins (off by default)",
    )
    http.add_argument(
        "--max-request-body-bytes",
        type=_positive,
        default=8 * 1024 * 1024,
        help="largest accepted request body",
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def config_from_args(args: argparse.Namespace, core_dests: set[str]) -> ServerConfig:
    """Build a :class:`ServerConfig`; flags the core does not know go to ``plugin_options``."""
    values = vars(args)
    fields = {f.name for f in ServerConfig.__attrs_attrs__}
    core: dict[str, Any] = {}
    for name in fields & values.keys():
        value = values[name]
        core[name] = tuple(value) if isinstance(value, list) else value
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
