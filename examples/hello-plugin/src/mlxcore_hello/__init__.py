"""mlxcore plugin ``hello``: a small, complete third-party plugin, as an example.

It shows what most plugins do:

* offer a tool-call parser (``mlxcore_tool_parsers``), here for a made-up format,
  ``<<call NAME {"json": "arguments"}>>``;
* add a command-line option (``mlxcore_addoption``), here ``--hello-greeting``;
* check and use that option once the command line is parsed (``mlxcore_configure``).

It is opt-in (``MLXCORE_AUTOLOAD = False``): once installed, ``mlxcore plugins``
lists it, but it runs only when asked for with ``--plugin hello``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.errors import UsageError
from mlxcore.model_info import ModelInfo
from mlxcore.parsers import ParsedDelta, ToolCall, ToolParser
from mlxcore.settings import add_flags, read_settings, setting

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with ``--plugin hello``."""

log = logging.getLogger("mlxcore.plugins.hello")

START = "<<call"
"""The marker that opens a call."""
END = ">>"
"""The marker that closes a call."""

_HEAD = re.compile(r"<<call\s+([A-Za-z_][\w.-]*)\s+(?=\{)")
"""An opened call: the marker, the function name, and the ``{`` of its arguments."""
_HEAD_PREFIX = re.compile(r"<<call(?:\s+(?:[A-Za-z_][\w.-]*\s*)?)?")
"""Text that could still grow into a :data:`_HEAD` (used with ``fullmatch``)."""


class HelloToolParser(ToolParser):
    """Parses tool calls written as ``<<call NAME {json arguments}>>``, anywhere in the text.

    Streaming rules, as the parser contract asks:

    * text that cannot be part of a call is released at once, as content;
    * text that might still become a call (a trailing ``<`` or ``<<ca``, an opened
      ``<<call NAME {...`` without its ``>>``) is held back until it is decided;
    * held-back text that turns out not to be a call is released as content, by
      ``feed`` as soon as that is certain, otherwise by ``finish``: never dropped.

    A ``>>`` inside the JSON arguments (in a string) does not end the call: the call
    ends at the first ``>>`` before which the arguments are a complete JSON object.
    """

    name = "hello"

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self._held = ""  # undecided text, released or turned into calls by _step
        self._scan = 0  # where to look for the next END in an opened call

    @classmethod
    def matches(cls, info: ModelInfo) -> bool:
        """Chosen by ``--tool-call-parser auto`` when the chat template uses ``<<call``."""
        return info.template_mentions(START)

    def feed(self, text: str) -> ParsedDelta:
        """Take the next piece of generated text; return what is decided so far."""
        self._held += text
        out = ParsedDelta()
        while self._held and self._step(out):
            pass
        return out

    def finish(self) -> ParsedDelta:
        """Release whatever is still held (an unfinished call) as content."""
        out = ParsedDelta(content=self._held)
        self._drop(len(self._held))
        return out

    def _step(self, out: ParsedDelta) -> bool:
        """Decide the beginning of the held text; False when more text is needed."""
        held = self._held
        start = held.find(START)
        if start < 0:  # no call: release everything but a possible beginning of one
            self._emit(out, len(held) - _partial_start(held))
            return False
        if start > 0:  # plain text before a call
            self._emit(out, start)
            return True
        head = _HEAD.match(held)
        if head is None:
            if _HEAD_PREFIX.fullmatch(held):
                return False  # "<<call", "<<call get_w": wait for more text
            self._emit(out, len(START))  # "<<caller", "<<call 42": not a call after all
            return True
        end = held.find(END, max(self._scan, head.end()))
        while end >= 0:
            arguments = held[head.end() : end].strip()
            if _is_json_object(arguments):
                out.tool_calls.append(ToolCall(name=head[1], arguments=arguments))
                self._drop(end + len(END))
                return True
            end = held.find(END, end + 1)  # that ">>" was inside the JSON
        self._scan = max(head.end(), len(held) - len(END) + 1)
        return False

    def _emit(self, out: ParsedDelta, length: int) -> None:
        """Release the first ``length`` held characters as content."""
        out.content += self._held[:length]
        self._drop(length)

    def _drop(self, length: int) -> None:
        """Forget the first ``length`` held characters (already released or parsed)."""
        self._held = self._held[length:]
        self._scan = 0


def _partial_start(text: str) -> int:
    """Length of the longest end of ``text`` that is a beginning of :data:`START`."""
    for length in range(min(len(text), len(START) - 1), 0, -1):
        if text.endswith(START[:length]):
            return length
    return 0


def _is_json_object(text: str) -> bool:
    """True when ``text`` is exactly one JSON object."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


@hookimpl
def mlxcore_tool_parsers() -> list[type[ToolParser]]:
    """Offer the ``hello`` tool parser (``--tool-call-parser hello``)."""
    return [HelloToolParser]


@attrs.frozen
class HelloSettings:
    """The plugin's settings: each default, type, flag and help written once."""

    hello_greeting: str = setting(
        "hello",
        metavar="TEXT",
        help="what the hello plugin logs at start-up (default: hello)",
    )


@hookimpl
def mlxcore_addoption(parser: argparse._ArgumentGroup) -> None:
    """Add ``--hello-greeting``, generated from :class:`HelloSettings`."""
    add_flags(parser, HelloSettings)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Read the settings back typed, check them and log: the last step of the option flow."""
    settings = read_settings(config, HelloSettings)
    if not settings.hello_greeting.strip():
        raise UsageError("--hello-greeting must not be empty")
    log.info(
        "%s from the hello plugin (tool parser %r)", settings.hello_greeting, HelloToolParser.name
    )
