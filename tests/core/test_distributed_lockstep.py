"""The lockstep's pieces that need no second rank: the step message's encoding, the
seed rank 0 draws, and the loop's stand-in handle (deferred cancellation, cached-token
count written through to the front end's handle)."""

from __future__ import annotations

import pytest

from mlxcore.distributed.lockstep import LockstepHandle, StepMessage, with_seed
from mlxcore.engine.events import RequestHandle, TokenEvent
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.engine.strategies import StepToken
from mlxcore.errors import MlxcoreError


def test_a_step_message_round_trips_and_an_empty_one_is_not_sent() -> None:
    request = GenerationRequest((1, 2, 3), max_tokens=5, options={"x": 1})
    message = StepMessage(admit=((7, request),), cancel=((3, "cancelled"),), keep_entries=2)
    assert StepMessage.decode(message.encode()) == message
    assert StepMessage().empty and StepMessage.decode(None) == StepMessage()
    assert not StepMessage(keep_entries=0).empty and not StepMessage(pause=0.01).empty
    settings = StepMessage(cache_settings={"cache": "radix", "gap": 420, "interval": 2048})
    assert not settings.empty and StepMessage.decode(settings.encode()) == settings
    with pytest.raises(MlxcoreError, match="rank 0 was lost"):
        StepMessage.decode(b"\x00" * 16)


def test_rank_zero_draws_the_seed_of_a_sampled_request_without_one() -> None:
    greedy = GenerationRequest((1,))
    seeded = GenerationRequest((1,), sampling=SamplingParams(temperature=1.0, seed=5))
    unseeded = GenerationRequest((1,), sampling=SamplingParams(temperature=1.0))
    assert with_seed(greedy) is greedy and with_seed(seeded) is seeded
    drawn = with_seed(unseeded)
    assert drawn.sampling.seed is not None and drawn.prompt_tokens == unseeded.prompt_tokens


def test_the_stand_in_defers_a_cancellation_to_the_next_step_message() -> None:
    events: list[object] = []
    real = RequestHandle(4, GenerationRequest((1, 2)), events.append)
    handle = LockstepHandle(4, real.request, real.sink, real)
    handle.cancel()  # a failed sink on rank 0: asked of the front end's handle only
    assert real.cancel_reason == "cancelled" and handle.cancel_reason is None
    handle.apply_end("cancelled")  # the step message applies it, on every rank
    assert handle.cancel_reason == "cancelled"
    handle.cached_tokens = 9
    assert real.cached_tokens == 9
    handle.sink(TokenEvent([StepToken(3)]))
    assert events == [TokenEvent([StepToken(3)])]
    follower = LockstepHandle(4, real.request, lambda _e: None, None)
    follower.cancel()  # nothing to ask on other ranks: only the message ends requests
    assert follower.cancel_reason is None
