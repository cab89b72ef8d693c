"""``mlxcore parse``: run the tool-call and reasoning parsers on raw model output.

Reads what a model wrote on stdin and prints, as JSON, the assistant message the
server would return for it (``content``, ``reasoning_content``, ``tool_calls``),
without loading any model::

    $ printf '<tool_call>\\n{"name": "f", "arguments": {}}\\n</tool_call>' \\
        | mlxcore parse --tool-call-parser hermes

The text goes through the server's own :class:`~mlxcore.output.pipeline.OutputPipeline`
(reasoning parser, then tool parser), in one piece, or with ``--chunk-size N`` in
pieces of ``N`` characters as a stream would deliver it; both must print the same
message. ``--prompt-tail`` is the end of the rendered prompt: when it leaves a
reasoning block open (``ReasoningParser.prompt_opens_reasoning``), the output starts
inside the reasoning, as in the server.

Tool call ids are random in the server; here they are numbered (``call_0``,
``call_1`` ...) so that two runs print identical JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from mlxcore.errors import UsageError
from mlxcore.parsers.selection import DISABLED

if TYPE_CHECKING:
    from mlxcore.hooks import PluginHooks
    from mlxcore.output.pipeline import OutputDelta
    from mlxcore.parsers.base import ReasoningParser, ToolParser
    from mlxcore.registry import Registry

HELP = "parse raw model output (stdin) into the assistant message the server would return"

P = TypeVar("P")


def add_parse_options(parser: argparse.ArgumentParser) -> None:
    """The flags of ``mlxcore parse``."""
    parser.add_argument(
        "--tool-call-parser",
        required=True,
        metavar="NAME",
        help="tool-call parser name (see `mlxcore plugins`), or none",
    )
    parser.add_argument(
        "--reasoning-parser",
        default="none",
        metavar="NAME",
        help="reasoning parser name, or none (default: none)",
    )
    parser.add_argument(
        "--tools",
        type=Path,
        default=None,
        metavar="FILE",
        help="JSON file with the request's tools (a list of OpenAI tools, or {'tools': [...]}): "
        "schema typing of arguments and recognition of degraded call forms",
    )
    parser.add_argument(
        "--prompt-tail",
        default="",
        metavar="TEXT",
        help="the end of the rendered prompt; a prompt that opened the reasoning block "
        "(e.g. ends with '<think>\\n') makes the output start inside the reasoning",
    )
    parser.add_argument(
        "--chunk-size",
        type=_chunk_size,
        default=None,
        metavar="N",
        help="feed the text in pieces of N characters through the streaming path "
        "(default: the whole text at once)",
    )


def _chunk_size(text: str) -> int:
    """argparse type: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def pick(registry: Registry[type[P]], name: str, flag: str) -> type[P] | None:
    """The parser class registered as ``name`` (``None`` for ``none``/``off``).

    Raises :class:`UsageError` naming the known parsers for an unknown name (and
    for ``auto``, which needs a model to match against).
    """
    if name in DISABLED:
        return None
    if name not in registry:
        known = ", ".join(registry.names()) or "none"
        why = "auto needs a model; name a parser" if name == "auto" else "no such parser"
        raise UsageError(f"{flag} {name!r}: {why} (known: {known}, none)")
    return registry.get(name)


def read_tools(path: Path | None) -> list[dict[str, Any]]:
    """The tools in ``path``: a JSON list of OpenAI tools or an object with ``tools``."""
    if path is None:
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--tools {str(path)!r}: {exc}") from None
    if isinstance(data, Mapping):
        data = data.get("tools")
    if not isinstance(data, list) or not all(isinstance(t, Mapping) for t in data):
        raise UsageError(f"--tools {str(path)!r}: expected a JSON list of tools")
    return [dict(t) for t in data]


class _TextDetokenizer:
    """Stands in for the streaming detokenizer: each step releases the next piece of text."""

    def __init__(self) -> None:
        self.pending = ""

    def add_token(self, token: int) -> None:
        """Nothing to decode: the text is given directly."""

    def finalize(self) -> None:
        """Nothing is held back."""

    @property
    def last_segment(self) -> str:
        """The piece given since the last call (then forgotten)."""
        text, self.pending = self.pending, ""
        return text


def pieces(text: str, chunk_size: int | None) -> Iterator[str]:
    """``text`` whole (``chunk_size`` ``None``) or in pieces of ``chunk_size`` characters."""
    if chunk_size is None:
        yield text
        return
    for pos in range(0, len(text), chunk_size):
        yield text[pos : pos + chunk_size]


def run_parsers(
    text: str,
    *,
    tool_parser: ToolParser | None,
    reasoning_parser: ReasoningParser | None,
    chunk_size: int | None = None,
) -> OutputDelta:
    """Push ``text`` through the server's output pipeline with these parser instances
    (whole, or in ``chunk_size`` pieces) and return everything it released, merged."""
    from mlxcore.engine.strategies import StepToken
    from mlxcore.output.pipeline import OutputDelta, OutputPipeline

    detok = _TextDetokenizer()
    pipe = OutputPipeline(detok, reasoning=reasoning_parser, tools=tool_parser)
    total = OutputDelta()
    steps: list[OutputDelta] = []
    for piece in pieces(text, chunk_size):
        detok.pending = piece
        steps.append(pipe.push([StepToken(0)]))
    steps.append(pipe.finish("stop"))
    for step in steps:
        total.content += step.content
        total.reasoning += step.reasoning
        total.tool_calls.extend(step.tool_calls)
    total.finish_reason = steps[-1].finish_reason
    return total


def assistant_message(out: OutputDelta) -> dict[str, Any]:
    """``out`` as the ``message`` of a non-streamed chat completion (numbered call ids)."""
    message: dict[str, Any] = {"role": "assistant", "content": out.content or None}
    if out.reasoning:
        message["reasoning_content"] = out.reasoning
    if out.tool_calls:
        message["tool_calls"] = [
            {
                "index": i,
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for i, call in enumerate(out.tool_calls)
        ]
    elif message["content"] is None:
        message["content"] = ""
    return message


def parse_text(
    text: str,
    hooks: PluginHooks,
    *,
    tool_parser: str,
    reasoning_parser: str = "none",
    tools: Sequence[Mapping[str, Any]] = (),
    prompt_tail: str = "",
    chunk_size: int | None = None,
) -> dict[str, Any]:
    """The assistant message for model output ``text`` with the named parsers."""
    tool_cls = pick(hooks.tool_parsers(), tool_parser, "--tool-call-parser")
    reasoning_cls = pick(hooks.reasoning_parsers(), reasoning_parser, "--reasoning-parser")
    reasoning = None
    if reasoning_cls is not None:
        opened = reasoning_cls.prompt_opens_reasoning(prompt_tail)
        reasoning = reasoning_cls(starts_in_reasoning=opened)
    out = run_parsers(
        text,
        tool_parser=tool_cls(list(tools)) if tool_cls is not None else None,
        reasoning_parser=reasoning,
        chunk_size=chunk_size,
    )
    return assistant_message(out)


def run_parse(args: argparse.Namespace, hooks: PluginHooks, stdin: TextIO | None = None) -> int:
    """``mlxcore parse``: read stdin, print the message as indented JSON; exit code."""
    # names are checked before stdin is read, so a typo fails at once
    pick(hooks.tool_parsers(), args.tool_call_parser, "--tool-call-parser")
    pick(hooks.reasoning_parsers(), args.reasoning_parser, "--reasoning-parser")
    tools = read_tools(args.tools)
    text = (stdin or sys.stdin).read()
    message = parse_text(
        text,
        hooks,
        tool_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        tools=tools,
        prompt_tail=args.prompt_tail,
        chunk_size=args.chunk_size,
    )
    print(json.dumps(message, indent=2, ensure_ascii=False))
    return 0
