"""``mlxcore bench --peer URL``: every workload on mlxcore and on another OpenAI-compatible
server, alternating. The peer here is a second real ``mlxcore serve`` on the same tiny model
(the documented peer, ``mlx_lm.server``, is measured in docs/benchmarks.md). Speed is never
asserted: the test checks that every workload ran on both sides in pairs, that the ratios
are there, and that mlxcore computed a shared new prefix once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlxcore.bench.peer import summarize
from mlxcore.bench.server import ServerProcess

pytestmark = [pytest.mark.timeout(300), pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.long
def test_peer_mode_runs_every_workload_on_both_sides(tiny_qwen3: Path, tmp_path: Path) -> None:
    out = tmp_path / "peer.json"
    with ServerProcess(str(tiny_qwen3), (), log_level="warning") as peer:
        peer.start(120)
        done = subprocess.run(
            [
                sys.executable, "-m", "mlxcore", "bench", str(tiny_qwen3),
                "--peer", peer.base_url, "--peer-model", peer.model_id,
                "--rounds", "1", "--concurrency", "2", "--max-tokens", "4",
                "--long-prompt-tokens", "300", "--prefix-tokens", "300",
                "--followup-max-tokens", "3", "--output", str(out), "--log-level", "warning",
            ],
            capture_output=True,
            text=True,
            timeout=280,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ratio" in done.stdout and "shared-prefix" in done.stdout
    result = json.loads(out.read_text())
    assert set(result["workloads"]) == {"uniform-2", "mixed", "shared-prefix"}
    for name, summary in result["workloads"].items():
        assert len(summary["pairs"]) == 1, name
        assert summary["mlxcore"] and summary["peer"], name
        assert "ttft_p50_s" in summary["ratios"] or "long_ttft_s" in summary["ratios"], name
    mixed = result["workloads"]["mixed"]["mlxcore"]
    # cold: only the chat template's first tokens can match an earlier prompt
    assert mixed["long_prompt_tokens"] >= 300 and mixed["long_cached_tokens"] < 8
    shared = result["workloads"]["shared-prefix"]
    for side in ("mlxcore", "peer"):  # the peer is an mlxcore too
        processed, total = shared[side]["prompt_tokens_processed"], shared[side]["prompt_tokens"]
        # 16 sessions with one new ~300-token prefix: about one prefix plus 16 questions
        assert processed < total / 4, (side, processed, total)


def test_ratios_are_medians_over_pairs() -> None:
    def pair(ours: tuple[float, float], theirs: tuple[float, float]) -> dict:
        names = ("ttft_p50_s", "aggregate_tok_s")
        return {
            "mlxcore": dict(zip(names, ours, strict=True)),
            "peer": dict(zip(names, theirs, strict=True)),
        }

    pairs = [
        pair((1.0, 30.0), (2.0, 20.0)),
        pair((1.0, 40.0), (4.0, 20.0)),
        pair((3.0, 10.0), (3.0, 0.0)),
    ]
    out = summarize(pairs)
    assert out["ratios"]["ttft_p50_s"] == 0.5  # median of 0.5, 0.25, 1.0
    assert out["ratios"]["aggregate_tok_s"] == 1.75  # a zero peer value gives no ratio
    assert out["mlxcore"]["aggregate_tok_s"] == 30.0 and out["peer"]["ttft_p50_s"] == 3.0
