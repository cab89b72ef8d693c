"""Fixtures shared by the engine-level tests in this folder."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import make_runtime


@pytest.fixture
def runtime() -> Iterator[Callable[..., Runtime]]:
    """``runtime(model_path, **config)``: an in-process runtime, shut down after the test."""
    made: list[Runtime] = []

    def factory(model: Path, **config: object) -> Runtime:
        made.append(make_runtime(model, **config))
        return made[-1]

    yield factory
    for rt in made:
        rt.engine.shutdown()
