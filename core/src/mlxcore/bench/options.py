"""The flags of ``mlxcore bench`` and the :class:`BenchSettings` they become.

The model and engine flags are the ones ``mlxcore serve`` takes (made from the same
:class:`~mlxcore.config.ServerConfig` fields); those that differ from their defaults are
passed on unchanged to the server subprocess, so the server runs exactly what was asked.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs

from mlxcore.config import ENGINE, PARSERS, ServerConfig
from mlxcore.settings import add_flags, positive_int


@attrs.frozen
class Profile:
    """The defaults of one kind of run (overridden by explicit flags)."""

    max_tokens: int
    repeats: int
    concurrency: tuple[int, ...]
    prefix_tokens: int


#: A full run.
FULL = Profile(max_tokens=256, repeats=3, concurrency=(1, 4, 8, 16), prefix_tokens=4000)
#: A ``--quick`` smoke run.
QUICK = Profile(max_tokens=64, repeats=1, concurrency=(1, 8), prefix_tokens=1000)


@attrs.frozen
class BenchSettings:
    """Everything one bench run needs.

    Attributes:
        model: the model argument (None: the embedded default).
        max_tokens: tokens asked for in every decode measurement.
        repeats: how many times each cheap measurement runs (the median is reported).
        concurrency: the concurrency levels of the aggregate-throughput measurement.
        prefix_tokens: the length, in tokens, of the shared system prompt.
        followup_max_tokens: tokens asked for in the prefix-cache requests (only TTFT counts).
        prefill_step_size: mlx-lm's prefill chunk in the in-process baseline (the server's
            ``--prefill-step-size``).
        seed: seeds the random words that keep every cold prefix unique.
        serve_args: flags passed on to ``mlxcore serve`` (model, engine, plugin flags).
        port: the server port (None: a free one).
        host: the server address.
        startup_timeout: seconds to wait for the server's ``/health``.
        sequential: run every mlx-lm measurement (and free its weights) before the server
            starts, instead of alternating single-stream runs with the server's.
        quick: a ``--quick`` run.
        json: print JSON instead of the table.
        output: also write the JSON here.
        log_level: the bench's own log level (the server logs at ``warning`` unless debugging).
    """

    model: str | None = None
    max_tokens: int = FULL.max_tokens
    repeats: int = FULL.repeats
    concurrency: tuple[int, ...] = FULL.concurrency
    prefix_tokens: int = FULL.prefix_tokens
    followup_max_tokens: int = 8
    prefill_step_size: int = 2048
    seed: int | None = None
    serve_args: tuple[str, ...] = ()
    port: int | None = None
    host: str = "127.0.0.1"
    startup_timeout: float = 600.0
    sequential: bool = False
    quick: bool = False
    json: bool = False
    output: Path | None = None
    log_level: str = "info"


def _concurrency_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,4,8,16, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers like 1,4,8,16, got {text!r}")
    return values


def add_bench_options(parser: argparse.ArgumentParser) -> None:
    """The flags only ``mlxcore bench`` takes (the model flags come from the CLI's options)."""
    group = parser.add_argument_group("bench")
    group.add_argument("--json", action="store_true", help="print JSON instead of the table")
    group.add_argument(
        "--quick",
        action="store_true",
        help="a fast smoke run: 64 tokens, 1 repeat, concurrency 1,8, a 1000-token prefix",
    )
    group.add_argument(
        "--output", type=Path, default=None, metavar="FILE", help="also write the JSON here"
    )
    group.add_argument(
        "--max-tokens", type=positive_int, default=None, help="tokens per decode request (256)"
    )
    group.add_argument(
        "--repeats", type=positive_int, default=None, help="runs per measurement, median (3)"
    )
    group.add_argument(
        "--concurrency",
        type=_concurrency_list,
        default=None,
        metavar="N,N,...",
        help="concurrency levels of the aggregate measurement (1,4,8,16)",
    )
    group.add_argument(
        "--prefix-tokens",
        type=positive_int,
        default=None,
        help="tokens of the shared system prompt in the prefix-cache measurement (4000)",
    )
    group.add_argument(
        "--followup-max-tokens",
        type=positive_int,
        default=8,
        help="tokens per prefix-cache request (only the TTFT is measured)",
    )
    group.add_argument("--seed", type=int, default=None, help="seed of the random prefix words")
    group.add_argument(
        "--port", type=int, default=None, help="port of the server (default: a free one)"
    )
    group.add_argument(
        "--startup-timeout", type=float, default=600.0, help="seconds to wait for the server"
    )
    group.add_argument(
        "--sequential",
        action="store_true",
        help="finish mlx-lm in-process (and free its weights) before starting the server, "
        "instead of alternating single-stream runs (halves peak memory; less robust to load)",
    )
    group.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for `mlxcore serve` (repeatable; write --serve-arg=--flag)",
    )


def _changed_model_flags(args: argparse.Namespace) -> list[str]:
    """The model/engine flags of ``args`` that differ from their defaults, as argv."""
    scratch = argparse.ArgumentParser(add_help=False)
    add_flags(scratch, ServerConfig, groups=(ENGINE, PARSERS))  # the model flags, as the CLI's
    return _changed_flags(scratch._actions, args)


def _changed_flags(actions: list[argparse.Action], args: argparse.Namespace) -> list[str]:
    """The flags among ``actions`` whose value in ``args`` is not their default, as argv."""
    argv: list[str] = []
    for action in actions:
        if not action.option_strings or not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        if value == action.default:
            continue
        flag = next(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            argv.append(flag)
        elif isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if value else f"--no-{flag[2:]}")
        else:
            argv += [flag, str(value)]
    return argv


def _plugin_flags(args: argparse.Namespace) -> list[str]:
    argv: list[str] = []
    for name in getattr(args, "plugins", None) or []:
        argv += ["--plugin", name]
    for name in getattr(args, "blocked_plugins", None) or []:
        argv += ["--no-plugin", name]
    if getattr(args, "disable_plugin_autoload", False):
        argv.append("--disable-plugin-autoload")
    return argv + _changed_flags(getattr(args, "mlxcore_plugin_actions", []), args)


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """Build the settings of a run from ``mlxcore bench``'s parsed arguments."""
    base = QUICK if args.quick else FULL

    def pick(name: str) -> int:
        value = getattr(args, name, None)
        return int(getattr(base, name) if value is None else value)

    serve_args = [*_changed_model_flags(args), *_plugin_flags(args), *args.serve_arg]
    return BenchSettings(
        model=args.model,
        max_tokens=pick("max_tokens"),
        repeats=pick("repeats"),
        concurrency=tuple(args.concurrency or base.concurrency),
        prefix_tokens=pick("prefix_tokens"),
        followup_max_tokens=args.followup_max_tokens,
        prefill_step_size=args.prefill_step_size,
        seed=args.seed,
        serve_args=tuple(serve_args),
        port=args.port,
        startup_timeout=args.startup_timeout,
        sequential=args.sequential,
        quick=args.quick,
        json=args.json,
        output=args.output,
        log_level=args.log_level,
    )
