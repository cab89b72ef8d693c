"""The agent-session replay reuses each turn's history on the hybrid test model."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from mlxcore.bench.agent import run_agent_session


def test_agent_session_turns_reuse_their_history(tiny_qwen3_5: Path) -> None:
    result = run_agent_session(str(tiny_qwen3_5), turns=4, system_tokens=600, max_tokens=2)
    turns = result["turns"]
    assert len(turns) == 4 and turns[0]["cached_tokens"] == 0
    for before, after in itertools.pairwise(turns):
        assert after["prompt_tokens"] > before["prompt_tokens"]
        assert after["cached_fraction"] >= 0.9, turns
    assert result["min_cached_fraction_after_first"] >= 0.9


@pytest.mark.long
def test_a_restart_loses_the_cache_unless_a_plugin_keeps_it(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    from mlxcore.testing.runtime import make_runtime

    def with_disk() -> Any:
        options = {"disk_cache_dir": str(tmp_path), "disk_cache_min_tokens": 64}
        return make_runtime(tiny_qwen3, "disk-cache", plugin_options=options, max_model_len=None)

    kept = run_agent_session(
        str(tiny_qwen3), turns=2, system_tokens=400, max_tokens=2, restart_at=1,
        sessions=2, make_runtime=with_disk,
    )  # fmt: skip
    lost = run_agent_session(
        str(tiny_qwen3), turns=2, system_tokens=400, max_tokens=2, restart_at=1
    )
    assert kept["restart_at"] == 1 and len(kept["sessions"]) == 2
    for turn in kept["first_turn_after_restart"]:
        assert turn["cached_fraction"] >= 0.9, kept["first_turn_after_restart"]
    assert kept["prefix_cache"]["prefix_cache_disk_reads"] >= 2
    (after,) = lost["first_turn_after_restart"]
    assert after["cached_tokens"] == 0


def test_side_requests_are_computed_once_where_whole_entries_recompute_them(
    tiny_qwen3_5: Path,
) -> None:
    """A side request per turn (the same system prompt and tools, its own first message):
    the radix cache computes about the session's distinct tokens; the whole-entry baseline
    recomputes every side request's shared prefix on this hybrid model."""
    result = run_agent_session(
        str(tiny_qwen3_5), turns=3, system_tokens=600, max_tokens=2, side_requests=True,
        baseline=True,
    )  # fmt: skip
    kinds = [r["kind"] for r in result["requests"]]
    assert kinds == ["main", "side"] * 3
    assert result["computed_over_distinct"] <= 1.2
    assert result["min_cached_of_shared"] >= 0.9
    assert result["baseline_computed_tokens"] > 1.5 * result["computed_tokens"]
    assert all("baseline_ttft_s" in r for r in result["requests"])


def test_the_claude_code_shape_replays_main_side_and_compacted_requests(
    tiny_qwen3_5: Path,
) -> None:
    """``--agent-shape claude-code`` at a small size: each main turn reuses its previous
    prompt, the side and compacted requests the system prompt and tools."""
    from mlxcore.bench.agent_long import run_long_session
    from mlxcore.bench.agent_shapes import SessionShape

    shape = SessionShape(system_tokens=300, tools=4, tool_tokens=150, result_tokens=400, turns=3)
    result = run_long_session(str(tiny_qwen3_5), shape, max_tokens=2, cold=False)
    rows = result["requests"]
    assert [(r["kind"], r["turn"]) for r in rows] == [
        ("main", 0), ("side", 0), ("main", 1), ("side", 1), ("main", 2), ("side", 2),
        ("main", 3), ("side", 3), ("compact", 4),
    ]  # fmt: skip
    assert all(result["targets"].values()), (result["targets"], rows)
    mains = [r for r in rows if r["kind"] == "main"]
    assert all(b["prompt_tokens"] - a["prompt_tokens"] > 400 for a, b in itertools.pairwise(mains))
    assert result["prefix_cache_budget_mb"] > 100  # sized from memory, not 32,768 tokens
