"""A finished request leaves no MLX memory to Python's cycle collector: its sequence's
cache is freed when the request ends, not at the next full collection (a long session
held every turn's whole cache until then)."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import pytest

from mlxcore.engine.request import GenerationRequest
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import make_runtime, submit_together


@pytest.fixture
def hybrid(tiny_qwen3_5: Path) -> Iterator[Runtime]:
    rt = make_runtime(tiny_qwen3_5)
    yield rt
    rt.engine.shutdown()


def test_a_finished_request_leaves_no_arrays_in_reference_cycles(hybrid: Runtime) -> None:
    # message starts and a history checkpoint: the prefill stops and offers snapshots
    request = GenerationRequest(
        tuple(range(100, 1700)), max_tokens=4, checkpoints=(1200,), boundaries=(300, 900)
    )
    submit_together(hybrid, [request])  # starts the engine, warms it up
    gc.collect()
    gc.disable()
    try:
        (done,) = submit_together(hybrid, [request])
        assert done.finish is not None and done.finish.usage.cached_tokens > 0
        time.sleep(0.2)  # the engine thread finishes its step
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        arrays = [o for o in gc.garbage if isinstance(o, mx.array)]
        kinds = sorted({type(o).__name__ for o in gc.garbage if "Cache" in type(o).__name__})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert arrays == [] and kinds == [], kinds
