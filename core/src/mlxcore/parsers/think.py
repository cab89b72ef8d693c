"""Reasoning between an opening and a closing tag: ``<think>...</think>`` and kin.

:class:`TagReasoningParser` streams reasoning as it comes (it is never held
back beyond a possible tag start or trailing whitespace) and is configured by
class attributes, so other formats (Gemma 4's ``<|channel>thought...<channel|>``,
MiniMax-M2's ``<think>``) are small subclasses.

Rules (the same as the vLLM reasoning parsers, made streaming-safe):

* output starts as content, unless the prompt already opened the block
  (``starts_in_reasoning``; Qwen3.5 and MiniMax-M2 end the generation prompt
  with ``<think>\\n``), in which case it starts as reasoning;
* an opening tag in the output starts reasoning; everything up to the closing
  tag is reasoning - also when the closing tag never comes (``max_tokens``):
  a stream cannot take back what it already sent as reasoning, so the
  non-streaming answer does the same. Output with no tags at all is content.
* a closing tag without an opening one is dropped (never shown); so are
  repeated opening tags and the format's :attr:`drop_markers`;
* a tool-call opener (:attr:`exit_markers`) at the start of a line inside
  reasoning ends the reasoning: models sometimes call a tool without closing
  their thoughts, and the call must reach the tool parser (mid-line it is just
  a mention, unless :attr:`exit_anywhere`);
* whitespace at both ends of the reasoning, and content whitespace touching a
  reasoning block, is dropped (templates write ``<think>\\n`` and ``</think>\\n\\n``).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from mlxcore.model_info import ModelInfo
from mlxcore.parsers.base import ParsedDelta, ReasoningParser
from mlxcore.parsers.streaming import MarkerSet, WhitespaceGate

State = Literal["content", "reasoning", "label"]
_MAX_LABEL = 24


class TagReasoningParser(ReasoningParser):
    """Base class: configure with the class attributes below."""

    open_tag: ClassVar[str] = "<think>"
    close_tag: ClassVar[str] = "</think>"
    exit_markers: ClassVar[tuple[str, ...]] = ()
    """Tool-call openers that end reasoning when one starts a line inside it."""
    exit_anywhere: ClassVar[bool] = False
    """Exit markers end reasoning anywhere, not only at a line start (set this when
    they are single special tokens that the model cannot write as prose)."""
    after_close: ClassVar[str] = "\n\n"
    """What the chat template writes between the closing tag and the answer: with the
    tag, what the server writes to end a thinking block whose budget is spent."""
    drop_markers: ClassVar[tuple[str, ...]] = ()
    """Control markup removed wherever it appears."""
    reasoning_labels: ClassVar[frozenset[str] | None] = None
    """When set, the opening tag is followed by a channel label (Gemma's ``thought``):
    these labels mean reasoning, any other word means content; the label and one
    newline after it are not shown."""

    _sets: ClassVar[dict[tuple[str, ...], MarkerSet]] = {}

    def __init__(self, *, starts_in_reasoning: bool = False) -> None:
        super().__init__(starts_in_reasoning=starts_in_reasoning)
        cls = type(self)
        self._in_content = self._set((cls.open_tag, cls.close_tag, *cls.drop_markers))
        self._in_reasoning = self._set(
            (cls.open_tag, cls.close_tag, *cls.exit_markers, *cls.drop_markers)
        )
        self._state: State = "reasoning" if starts_in_reasoning else "content"
        self._pending = ""
        self._label = ""
        self._content = WhitespaceGate()
        self._reasoning = WhitespaceGate(after_block=True)
        self._line_start = True  # inside reasoning: the last character was a newline
        self._out = ParsedDelta()

    @staticmethod
    def _set(markers: tuple[str, ...]) -> MarkerSet:
        found = TagReasoningParser._sets.get(markers)
        if found is None:
            found = TagReasoningParser._sets[markers] = MarkerSet(markers)
        return found

    @classmethod
    def prompt_opens_reasoning(cls, prompt_text: str) -> bool:
        """True when the prompt ends with the opening tag (plus a reasoning label and
        whitespace): the generation prompt opened the block."""
        tail = prompt_text.rstrip()
        if tail.endswith(cls.open_tag):
            return True
        labels = cls.reasoning_labels or ()
        return any(tail.endswith(cls.open_tag + label) for label in labels)

    # -- the contract --------------------------------------------------------

    def feed(self, text: str) -> ParsedDelta:
        """Split ``text`` into reasoning and content; hold back a possible tag start."""
        self._run(text, final=False)
        return self._take()

    def finish(self) -> ParsedDelta:
        """Release everything held; an unclosed block's text stays reasoning."""
        self._run("", final=True)
        self._out.content += self._content.flush()
        return self._take()

    # -- machinery -----------------------------------------------------------

    def _take(self) -> ParsedDelta:
        out, self._out = self._out, ParsedDelta()
        return out

    def _emit(self, text: str) -> None:
        if self._state == "reasoning":
            self._emit_reasoning(text)
        else:
            self._out.content += self._content.push(text)

    def _emit_reasoning(self, text: str) -> None:
        if text:
            self._out.reasoning += self._reasoning.push(text)
            if text.strip(" \t"):
                self._line_start = text.rstrip(" \t").endswith("\n")

    def _run(self, text: str, *, final: bool) -> None:
        buf = self._pending + text
        self._pending = ""
        while buf or (final and self._state == "label"):
            if self._state == "label":
                buf = self._read_label(buf, final)
                if self._state == "label":
                    return
                continue
            markers = self._in_reasoning if self._state == "reasoning" else self._in_content
            index, marker = markers.find(buf)
            if index < 0:
                keep = 0 if final else markers.partial(buf)
                self._emit(buf[: len(buf) - keep])
                self._pending = buf[len(buf) - keep :]
                return
            self._emit(buf[:index])
            buf = self._on_marker(marker, buf[index + len(marker) :])

    def _on_marker(self, marker: str, rest: str) -> str:
        """Apply ``marker``; return the text still to scan."""
        cls = type(self)
        if marker in cls.drop_markers:
            return rest  # removed; the text around it is untouched
        if self._state == "content":
            self._content.block()  # an opening or a stray closing tag
            if marker == cls.open_tag:
                self._open()
            return rest
        if marker == cls.close_tag:
            self._close()
        elif marker in cls.exit_markers:
            if not (cls.exit_anywhere or self._line_start or self._reasoning.after_block):
                self._emit_reasoning(marker)  # mentioned mid-line: just reasoning text
                return rest
            self._close()
            return marker + rest  # content markers never include exit markers
        return rest  # a repeated opening tag

    def _open(self) -> None:
        self._reasoning = WhitespaceGate(after_block=True)
        self._line_start = True
        if type(self).reasoning_labels is not None:
            self._state = "label"
            self._label = ""
        else:
            self._state = "reasoning"

    def _close(self) -> None:
        self._reasoning.block()  # trailing reasoning whitespace is not shown
        self._content.block()
        self._state = "content"

    def _read_label(self, buf: str, final: bool) -> str:
        """Collect the channel label after the opening tag; return the unread text."""
        text = self._label + buf
        i = 0
        while i < len(text) and i < _MAX_LABEL and (text[i].isalnum() or text[i] == "_"):
            i += 1
        if i == len(text) and i < _MAX_LABEL and not final:
            self._label = text
            return ""
        label, rest = text[:i], text[i:]
        labels = type(self).reasoning_labels or frozenset()
        self._label = ""
        if label in labels or not label:
            self._state = "reasoning"
        elif label.lower() in {"content", "final", "answer", "response"}:
            self._state = "content"
            self._content.block()
        else:  # not a label: the word is reasoning text
            self._state = "reasoning"
            return text
        if rest.startswith("\n"):
            rest = rest[1:]
        return rest


class ThinkReasoningParser(TagReasoningParser):
    """``<think>...</think>`` reasoning (Qwen3, Qwen3.5, DeepSeek-R1 style, SmolLM3...).

    Matches chat templates that mention ``</think>``. A ``<tool_call>`` starting a
    line inside reasoning ends it.
    """

    name = "think"
    exit_markers = ("<tool_call>",)

    @classmethod
    def matches(cls, info: ModelInfo) -> bool:
        """The chat template handles ``</think>``."""
        return info.template_mentions("</think>")
