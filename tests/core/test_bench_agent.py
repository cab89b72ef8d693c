"""The agent-session replay reuses each turn's history on the hybrid test model."""

from __future__ import annotations

import itertools
from pathlib import Path

from mlxcore.bench.agent import run_agent_session


def test_agent_session_turns_reuse_their_history(tiny_qwen3_5: Path) -> None:
    result = run_agent_session(str(tiny_qwen3_5), turns=4, system_tokens=600, max_tokens=2)
    turns = result["turns"]
    assert len(turns) == 4 and turns[0]["cached_tokens"] == 0
    for before, after in itertools.pairwise(turns):
        assert after["prompt_tokens"] > before["prompt_tokens"]
        assert after["cached_fraction"] >= 0.9, turns
    assert result["min_cached_fraction_after_first"] >= 0.9
