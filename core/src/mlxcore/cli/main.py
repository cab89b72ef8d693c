"""The ``mlxcore`` command: serve, generate, bench, plugins, parse.

Start-up order: read the plugin-selection flags, load plugins (built-ins first),
let them add options, parse the whole command line, configure plugins, then run
the command. Any failure before serving exits non-zero with one clear line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mlxcore.cli import options
from mlxcore.errors import MlxcoreError

if TYPE_CHECKING:
    from mlxcore.config import ServerConfig
    from mlxcore.hooks import PluginHooks

# Everything else (MLX, Litestar, the plugins) is imported after the process has
# re-executed itself with OpenBLAS preloaded (``main``), so that start-up pays for
# those imports once, not twice.

log = logging.getLogger("mlxcore.cli")

CORE_COMMANDS = ("serve", "generate", "bench", "plugins", "parse", "launch", "agent", "models")
MODEL_COMMANDS = ("serve", "generate", "bench")


def build_parser(hooks: PluginHooks | None) -> tuple[argparse.ArgumentParser, set[str]]:
    """The full parser (plugin groups included when ``hooks`` is given) and the
    ``dest`` names that belong to the core."""
    from mlxcore.bench.agent import add_agent_options
    from mlxcore.bench.compare import add_compare_options
    from mlxcore.bench.options import add_bench_options
    from mlxcore.bench.peer import add_peer_options
    from mlxcore.cli.agent_command import HELP as AGENT_HELP
    from mlxcore.cli.agent_command import add_agent_command
    from mlxcore.cli.launch_command import HELP as LAUNCH_HELP
    from mlxcore.cli.launch_command import add_launch_command
    from mlxcore.cli.models_command import HELP as MODELS_HELP
    from mlxcore.cli.models_command import add_models_command
    from mlxcore.cli.parse_command import HELP as PARSE_HELP
    from mlxcore.cli.parse_command import add_parse_options

    parser = argparse.ArgumentParser(
        prog="mlxcore", description="Serve MLX language models over an OpenAI-compatible API."
    )
    parser.add_argument("--version", action="version", version=options.version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    core_dests: set[str] = {"command"}

    def add(
        name: str, help_text: str, *adders: Callable[[argparse.ArgumentParser], None]
    ) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        options.add_common(cmd)
        for adder in adders:
            adder(cmd)
        core_dests.update(a.dest for a in cmd._actions)
        return cmd

    serve = add(
        "serve", "serve a model over HTTP", options.add_model_options, options.add_server_options
    )
    gen = add(
        "generate",
        "generate a completion once, streamed to the terminal",
        options.add_model_options,
    )
    gen.add_argument(
        "--prompt", "-p", required=True, help="the user message (or raw text with --raw)"
    )
    gen.add_argument("--system", default=None, help="a system message")
    gen.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="most tokens to generate (default: 256, or what the context leaves)",
    )
    gen.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument(
        "--request-options",
        type=json.loads,
        default={},
        metavar="JSON",
        help="per-request plugin options, as the extra fields of an HTTP request body "
        """(e.g. '{"speculative": false}'); checked by the plugins the same way""",
    )
    core_dests.update(a.dest for a in gen._actions)
    bench = add(
        "bench",
        "measure decode speed, concurrency and prefix caching: mlx-lm in-process vs mlxcore HTTP",
        options.add_model_options,
        add_bench_options,
        add_agent_options,
        add_compare_options,
        add_peer_options,
    )
    add("plugins", "list installed plugins: name, distribution, version, hooks, status")
    add_launch_command(add("launch", LAUNCH_HELP))
    add("parse", PARSE_HELP, add_parse_options)
    add("agent", AGENT_HELP, add_agent_command)
    add("models", MODELS_HELP, add_models_command)
    if hooks is not None:
        hooks.add_commands(_PluginCommands(sub))
        core_dests.add("mlxcore_handler")
        for cmd in (serve, gen, bench):
            hooks.addoption(cmd)
        # the bench passes the plugins' flags on to the server it starts
        plugin_actions = [a for a in bench._actions if a.dest not in core_dests]
        bench.set_defaults(mlxcore_plugin_actions=plugin_actions)
        core_dests.add("mlxcore_plugin_actions")
    return parser, core_dests


class _PluginCommands:
    """What ``mlxcore_add_commands`` receives: argparse subparsers whose new commands
    also take the common flags (``--log-level``, ``--plugin`` ...)."""

    def __init__(self, subparsers: Any) -> None:
        self._subparsers = subparsers

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """Add a subcommand (argparse's ``add_parser``) with the common flags."""
        cmd: argparse.ArgumentParser = self._subparsers.add_parser(name, **kwargs)
        options.add_common(cmd)
        return cmd


def setup_logging(level: str, kind: str = "text") -> None:
    """Log mlxcore's own loggers (and uvicorn's) at ``level``, as ``kind`` (``text`` or
    ``json``), each line with the id of the request it was written for; the root logger
    is untouched."""
    from mlxcore.server.request_ids import RequestIdFilter, log_formatter

    numeric = logging.DEBUG if level == "trace" else getattr(logging, level.upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(log_formatter(kind))
    for name in ("mlxcore", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.setLevel(numeric)
    root_mlx = logging.getLogger("mlxcore")
    if not any(getattr(h, "_mlxcore", False) for h in root_mlx.handlers):
        handler._mlxcore = True  # type: ignore[attr-defined]
        root_mlx.addHandler(handler)
        root_mlx.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mlxcore`` command; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = options.first_phase(argv)
    setup_logging(pre.log_level, pre.log_format)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in MODEL_COMMANDS:
        from mlxcore.blas import keep_float32_exact, log_blas_status, reexec_with_openblas

        reexec_with_openblas(argv)
        log_blas_status()
        keep_float32_exact()
    from mlxcore.hooks import PluginHooks
    from mlxcore.plugins import (
        PluginSelection,
        command_providers,
        create_plugin_manager,
        load_plugins,
    )

    try:
        pm = create_plugin_manager()
        enable = list(pre.plugins)
        if command is not None and command not in CORE_COMMANDS:
            provider = command_providers().get(command)
            if provider is not None and provider not in enable:
                enable.append(provider)
        selection = PluginSelection.from_env(
            enable, pre.blocked_plugins, disable_autoload=pre.disable_plugin_autoload
        )
        load_plugins(pm, selection)
        hooks = PluginHooks(pm)
        parser, core_dests = build_parser(hooks)
        agent_args: list[str] = []
        if command == "agent":
            from mlxcore.cli.agent_command import split_agent_args

            argv, agent_args = split_agent_args(argv)
        args = parser.parse_args(argv)
        args.agent_args = agent_args
        if args.command is None:
            parser.print_help()
            return 2
        if args.command == "plugins":
            from mlxcore.cli.commands import list_plugins

            return list_plugins(pm)
        if args.command == "launch":
            from mlxcore.cli.launch_command import run_launch

            return run_launch(args)
        if args.command == "agent":
            from mlxcore.cli.agent_command import run_agent

            return run_agent(args)
        if args.command == "models":
            from mlxcore.cli.models_command import run_models

            return run_models(args)
        if args.command == "parse":
            from mlxcore.cli.parse_command import run_parse

            return run_parse(args, hooks)
        handler = getattr(args, "mlxcore_handler", None)
        if handler is not None:
            code: int = handler(args)
            return code
        config = options.config_from_args(args, core_dests)
        hooks.configure(config)
        if args.command == "serve":
            from mlxcore.cli.commands import serve
            from mlxcore.cli.model_specs import served_models

            return serve(config, hooks, served_models(config, hooks, args, core_dests, selection))
        return _run_model_command(args, config, hooks)
    except MlxcoreError as exc:
        print(f"mlxcore: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _run_model_command(args: argparse.Namespace, config: ServerConfig, hooks: PluginHooks) -> int:
    """``generate`` or ``bench`` (``serve`` goes through the model router)."""
    from mlxcore.cli import commands

    if args.command == "generate":
        return commands.generate(args, config, hooks)
    from mlxcore.bench import run_bench

    return run_bench(args, config, hooks)
