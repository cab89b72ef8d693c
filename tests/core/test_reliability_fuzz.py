"""The reliability fuzz keeps its generations short (scripts/reliability/fuzz.py): a
drawn body with a null budget ran to the server's default behind a queue (485 s, past
the client's timeout), so null counts as no budget."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts" / "reliability"))
fuzz = pytest.importorskip("fuzz")


@pytest.mark.parametrize(
    ("path", "field"),
    [("/v1/responses", "max_output_tokens"), ("/v1/chat/completions", "max_tokens")],
)
@pytest.mark.parametrize("budget", ["absent", None, 10**9])
def test_every_generation_budget_is_capped(path: str, field: str, budget: object) -> None:
    rng = random.Random(7)
    body = {"input": "x"} if budget == "absent" else {"input": "x", field: budget}
    for _ in range(40):
        bounded = fuzz._bounded(path, dict(body), rng)
        assert isinstance(bounded[field], int)
        assert 1 <= bounded[field] <= fuzz.CAPPED_LIMIT
