"""A fault-injection plugin: strategies that raise or hang when a request asks them to.

Enable it with ``mlxcore serve --plugin mlxcore.testing.faults`` (never in production:
any client can trigger the faults). A request then carries ``"fault": "WHERE:WHAT"``
in its body, where WHERE is one of

* ``decoder``: the decode step of the batch holding the request,
* ``decoder-remove``: taking the finished request out of the batch (this escapes the
  engine's per-request guards: a fault the engine must restart from),
* ``prefill``: the request's prefill,
* ``setup``: the request's set-up on the engine thread (sampler, processors, cache),
* ``processor``: the request's logits processor,

and WHAT is ``raise`` or ``hang`` (blocks for an hour, for the watchdog to find). Each
fault fires once per request, except ``decoder:poison``, which raises at every decode step
of a batch holding the request (before the step touches the batch: the engine then finds
the request by retrying without half of the batch, and fails it alone). The reliability
suite and the tests use it to show that a fault fails the requests it touches, never hangs
anything, and that the engine recovers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.defaults.chunked_prefill import ChunkedPrefill
from mlxcore.defaults.decoder import PlainDecoder
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import (
    DecodeSequence,
    LogitsProcessor,
    PrefillGenerator,
    PrefillTask,
    SequenceCache,
    StepToken,
)
from mlxcore.errors import OptionError
from mlxcore.model_info import ModelInfo

OPTION = "fault"
WHERE = ("decoder", "decoder-remove", "prefill", "setup", "processor")
WHAT = ("raise", "hang", "poison")
HANG_SECONDS = 3600.0


class InjectedFault(RuntimeError):
    """The exception an injected ``raise`` fault throws."""


def fault_of(request: GenerationRequest, where: str) -> str | None:
    """``raise`` / ``hang`` when ``request`` asks for a fault at ``where``."""
    value = request.options.get(OPTION)
    if not isinstance(value, str) or ":" not in value:
        return None
    place, _, action = value.partition(":")
    return action if place == where and action in WHAT else None


def fire(action: str, where: str) -> None:
    """Raise or hang, as ``action`` says."""
    if action == "hang":
        threading.Event().wait(HANG_SECONDS)
    raise InjectedFault(f"injected fault at {where}")


class FaultyDecoder(PlainDecoder):
    """The plain decoder, failing ``step`` or ``remove`` for requests that ask."""

    name = "faulty"

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self._fired: set[int] = set()

    def _armed(self, seq: DecodeSequence, where: str) -> str | None:
        action = fault_of(seq.request, where)
        if action is None or seq.uid in self._fired:
            return None
        self._fired.add(seq.uid)
        return action

    def step(self) -> dict[int, list[StepToken]]:
        for seq in [slot.seq for slot in self.slots if not slot.left] + list(self._joining):
            if fault_of(seq.request, "decoder") == "poison":
                raise InjectedFault(f"injected fault at decoder (request {seq.uid} in the batch)")
        for slot in self.slots:
            if slot.left:
                continue
            action = self._armed(slot.seq, "decoder")
            if action is not None:
                fire(action, "decoder")
        return super().step()

    def remove(self, uid: int) -> SequenceCache | None:
        for seq in [s.seq for s in self.slots] + list(self._joining):
            if seq.uid == uid:
                action = self._armed(seq, "decoder-remove")
                if action is not None:
                    fire(action, "decoder-remove")
        return super().remove(uid)


class FaultyPrefill(ChunkedPrefill):
    """Chunked prefill that fails for requests that ask (never batched with others)."""

    name = "faulty"

    def can_batch(self, task: PrefillTask) -> bool:
        return fault_of(task.request, "prefill") is None and super().can_batch(task)

    def prefill_batch(self, tasks: Sequence[PrefillTask]) -> list[Any]:
        return ChunkedPrefill.prefill_batch(self, tasks)

    def prefill(self, task: PrefillTask) -> PrefillGenerator:
        action = fault_of(task.request, "prefill")
        if action is not None:
            fire(action, "prefill")
        return (yield from ChunkedPrefill.prefill(self, task))


@hookimpl
def mlxcore_decoder(model: Any, info: ModelInfo, config: ServerConfig) -> FaultyDecoder:
    """The fault-injecting decoder."""
    return FaultyDecoder(model)


@hookimpl
def mlxcore_prefill_strategy(model: Any, info: ModelInfo, config: ServerConfig) -> FaultyPrefill:
    """The fault-injecting prefill."""
    return FaultyPrefill(model, step_size=config.prefill_step_size)


@hookimpl
def mlxcore_logits_processors(
    request: GenerationRequest, info: ModelInfo
) -> list[LogitsProcessor] | None:
    """A processor that fails (``processor`` fault), or a failing set-up (``setup``)."""
    action = fault_of(request, "setup")
    if action is not None:
        fire(action, "request set-up")
    action = fault_of(request, "processor")
    if action is None:
        return None
    fired = threading.Event()

    def faulty(tokens: Any, logits: Any) -> Any:
        if not fired.is_set():
            fired.set()
            fire(action, "processor")
        return logits

    return [faulty]


@hookimpl
def mlxcore_request_options() -> list[str]:
    """``fault``."""
    return [OPTION]


@hookimpl
def mlxcore_validate_options(options: dict[str, Any], config: ServerConfig) -> None:
    """``fault`` must name a known place and action."""
    value = options.get(OPTION)
    if value is None:
        return
    place, _, action = str(value).partition(":")
    if place not in WHERE or action not in WHAT:
        raise OptionError(OPTION, f"expected WHERE:WHAT with WHERE in {WHERE} and WHAT in {WHAT}")
