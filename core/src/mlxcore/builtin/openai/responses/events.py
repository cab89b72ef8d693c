"""Output deltas to Responses API output items and stream events.

One :class:`OutputWriter` serves both modes: it turns the output pipeline's deltas into
the typed event sequence the SDKs parse (``response.output_item.added``,
``response.output_text.delta``, ...) while building the ``output`` list; a non-streamed
response runs the same writer and keeps only the list, so the two cannot disagree.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import msgspec

from mlxcore.builtin.openai.responses.items import encode_reasoning
from mlxcore.output import OutputDelta
from mlxcore.output.calls import CallEvent, CallStream


def new_item_id(prefix: str) -> str:
    """An output item id such as ``msg_<hex>``."""
    return f"{prefix}_{uuid.uuid4().hex}"


def sse_event(payload: dict[str, Any]) -> bytes:
    """One Responses stream event (``event:`` line named by its ``type``)."""
    kind = str(payload["type"]).encode()
    return b"event: " + kind + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"


class OutputWriter:
    """Builds a response's output items from deltas, emitting stream events on the way.

    Args:
        namespaces: the namespace of each namespaced function tool (``function_call``
            items carry it back).
        encrypted_reasoning: add ``encrypted_content`` to reasoning items (the client
            asked for ``include: ["reasoning.encrypted_content"]``).
    """

    def __init__(
        self, *, namespaces: Mapping[str, str] | None = None, encrypted_reasoning: bool = False
    ) -> None:
        self.output: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.sequence = 0
        self.namespaces = dict(namespaces or {})
        self.encrypted_reasoning = encrypted_reasoning
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._text = ""
        self._call_stream = CallStream()
        self._calls: dict[str, dict[str, Any]] = {}  # open function_call items by call id

    # -- events --------------------------------------------------------------------

    def emit(self, payload: dict[str, Any]) -> None:
        """Queue an event (numbered) for :meth:`drain`."""
        payload["sequence_number"] = self.sequence
        self.sequence += 1
        self.events.append(payload)

    def drain(self) -> list[bytes]:
        """The events queued since the last call, encoded."""
        out = [sse_event(e) for e in self.events]
        self.events = []
        return out

    # -- items ---------------------------------------------------------------------

    @property
    def _index(self) -> int:
        return len(self.output) - 1

    def _start(self, item: dict[str, Any]) -> None:
        self.output.append(item)
        self._open = item
        self._text = ""
        self.emit(
            {"type": "response.output_item.added", "output_index": self._index, "item": _copy(item)}
        )

    def _open_kind(self, kind: str) -> None:
        if self._open is not None and self._open["type"] == kind:
            return
        self.close()
        if kind == "message":
            item = {
                "type": "message",
                "id": new_item_id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"type": "reasoning", "id": new_item_id("rs"), "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        self._start(item)
        self.emit(
            {
                "type": "response.content_part.added",
                "item_id": item["id"],
                "output_index": self._index,
                "content_index": 0,
                "part": dict(part),
            }
        )

    def _delta(self, kind: str, text: str) -> None:
        self._open_kind(kind)
        assert self._open is not None
        self._text += text
        event = (
            "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        )
        payload: dict[str, Any] = {
            "type": event,
            "item_id": self._open["id"],
            "output_index": self._index,
            "content_index": 0,
            "delta": text,
        }
        if kind == "message":
            payload["logprobs"] = []
        self.emit(payload)

    def close(self) -> None:
        """Finish the open text or reasoning item (its ``.done`` events)."""
        item, self._open = self._open, None
        if item is None:
            return
        text = self._text
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            done = {"type": "response.output_text.done", "logprobs": []}
        else:
            part = {"type": "reasoning_text", "text": text}
            done = {"type": "response.reasoning_text.done"}
            if self.encrypted_reasoning:
                item["encrypted_content"] = encode_reasoning(text)
        base = {"item_id": item["id"], "output_index": self.output.index(item), "content_index": 0}
        self.emit({**done, **base, "text": text})
        self.emit({"type": "response.content_part.done", **base, "part": dict(part)})
        item["content"] = [part]
        item["status"] = "completed"
        self.emit(
            {
                "type": "response.output_item.done",
                "output_index": base["output_index"],
                "item": _copy(item),
            }
        )

    def _call(self, event: CallEvent) -> None:
        """A function call item: added when the call opens, argument deltas as they
        come, done when it closes."""
        if event.kind == "open":
            self.close()
            item: dict[str, Any] = {
                "type": "function_call",
                "id": new_item_id("fc"),
                "call_id": event.id,
                "name": event.name,
                "arguments": "",
                "status": "in_progress",
            }
            if event.name in self.namespaces:
                item["namespace"] = self.namespaces[event.name]
            self._start(item)
            self._open = None
            self._calls[event.id] = item
            return
        item = self._calls[event.id]
        base = {"item_id": item["id"], "output_index": self.output.index(item)}
        if event.kind == "arguments":
            self.emit(
                {"type": "response.function_call_arguments.delta", **base, "delta": event.text}
            )
            return
        del self._calls[event.id]
        if event.kind == "abort":  # its text follows as a message
            item["status"] = "incomplete"
            done = {"type": "response.output_item.done", "output_index": base["output_index"]}
            self.emit({**done, "item": _copy(item)})
            return
        call = event.call
        assert call is not None
        self.emit(
            {
                "type": "response.function_call_arguments.done",
                **base,
                "name": call.name,
                "arguments": call.arguments,
            }
        )
        item["arguments"], item["status"] = call.arguments, "completed"
        self.emit(
            {
                "type": "response.output_item.done",
                "output_index": base["output_index"],
                "item": _copy(item),
            }
        )

    def write(self, delta: OutputDelta) -> None:
        """Take the next delta of the generation."""
        if delta.reasoning:
            self._delta("reasoning", delta.reasoning)
        if delta.content:
            self._delta("message", delta.content)
        for event in self._call_stream.events(delta):
            self._call(event)

    def finish(self, incomplete: bool) -> None:
        """Close the open item; an incomplete response leaves its last item incomplete."""
        last = self._open
        self.close()
        if incomplete and last is not None:
            last["status"] = "incomplete"


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    out = dict(item)
    if isinstance(out.get("content"), list):
        out["content"] = [dict(p) for p in out["content"]]
    return out
