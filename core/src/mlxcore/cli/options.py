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
        "--mlx-cache-limit",
        dest="mlx_cache_limit_bytes",
        type=_byte_size,
        default=512 * 1024 * 1024,
        metavar="SIZE",
        help="most memory MLX keeps in its buffer cache for reuse (e.g. 512MB, 0); the rest "
        "is given back (default 512MiB)",
    )
    engine.add_argument(
        "--max-queue-wait",
        type=_seconds,
        default=120.0,
        metavar="SECONDS",
        help="a request waiting longer than this to start is answered as overloaded "
        "(503 with Retry-After; 0: no limit)",
    )
    engine.add_argument(
        "--engine-watchdog",
        type=_seconds,
        default=300.0,
        metavar="SECONDS",
        help="an engine step making no progress this long is a fault: its requests fail, "
        "the engine restarts (0: off)",
    )
    engine.add_argument(
        "--engine-max-restarts",
        type=int,
        default=3,
        metavar="N",
        help="engine restarts allowed in ten minutes; past them the server exits non-zero",
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
    http.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=20.0,
        metavar="SECONDS",
        help="on SIGTERM, how long running requests may take to finish",
    )
    http.add_argument(
        "--header-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="close a connection whose request head or body takes longer than this to arrive",
    )
    http.add_argument(
        "--prepare-workers",
        type=_positive,
        default=2,
        metavar="N",
        help="threads that template, tokenize and fetch media for new requests",
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_BYTE_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30})


def _byte_size(text: str) -> int:
    """``512MB``, ``2GiB``, ``0`` or a plain number of bytes."""
    value = text.strip().lower()
    number = value.rstrip("kmgib")
    unit = value[len(number) :]
    try:
        size = float(number)
    except ValueError:
        size = -1.0
    if unit not in _BYTE_UNITS or not 0 <= size < 2**50:
        raise argparse.ArgumentTypeError(f"expected a size such as 512MB or 2GiB, got {text!r}")
    return int(size * _BYTE_UNITS[unit])


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
