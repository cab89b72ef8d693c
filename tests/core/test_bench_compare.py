"""``mlxcore bench --compare-body``: a plugin's feature on vs off on one real server.

The feature here is the qwen35-mtp plugin's speculative decoding on the tiny Qwen3.5 test
model; ``{"speculative": false}`` turns it off per request. Speed is never asserted: the test
checks that both sides ran, that the off body really reached the server (only the "on"
requests report speculation), and that ``--prompt-tokens`` gives cold prompts of that size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(240), pytest.mark.e2e, pytest.mark.slow]


def _bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlxcore", "bench", *argv],
        capture_output=True,
        text=True,
        timeout=220,
    )


@pytest.mark.long
def test_compare_runs_both_sides_with_cold_prompts(tiny_qwen3_5: Path, tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    done = _bench(
        str(tiny_qwen3_5),
        "--serve-arg=--plugin=qwen35-mtp",
        "--compare-body",
        '{"speculative": false}',
        "--prompt-tokens",
        "300",
        "--concurrency",
        "1,2",
        "--repeats",
        "2",
        "--max-tokens",
        "6",
        "--output",
        str(out),
        "--log-level",
        "warning",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "median of per-repeat ratios: decode" in done.stdout
    result = json.loads(out.read_text())
    assert result["settings"]["off_body"] == {"speculative": False}
    assert [row["concurrency"] for row in result["compare"]] == [1, 2]
    for row in result["compare"]:
        for side in ("on", "off"):
            part = row[side]
            assert len(part["runs"]) == 2
            assert part["ttft_median_s"] > 0
            assert part["aggregate_tok_s"] > 0
            # every prompt is new: about 300 tokens, nothing of it cached
            assert part["prompt_tokens_median"] >= 300
            assert part["cached_tokens_max"] == 0
        assert "speculative_tokens_per_step" in row["on"]["usage_extra"]
        assert "speculative_tokens_per_step" not in row["off"]["usage_extra"]
        assert set(row["ratios"]) >= {"decode_paired", "aggregate_paired", "decode_on_vs_off"}
        assert all(value > 0 for value in row["ratios"].values())


@pytest.mark.parametrize("body", ["not json", "[1, 2]", "{}"])
def test_compare_body_must_be_a_json_object(body: str) -> None:
    done = _bench("--compare-body", body)
    assert done.returncode == 2
    assert "--compare-body" in done.stderr


def test_edit_prompt_and_prompt_tokens_are_exclusive() -> None:
    done = _bench(
        "--compare-body", '{"speculative": false}', "--edit-prompt", "--prompt-tokens", "64"
    )
    assert done.returncode != 0
    assert "--edit-prompt and --prompt-tokens" in done.stderr


def test_edit_prompt_holds_a_file_of_about_2000_tokens() -> None:
    from mlxcore.bench import workloads
    from mlxcore.models.default import ensure_default_model

    count = workloads.token_counter(ensure_default_model())
    texts = [workloads.edit_messages(i)[0]["content"] for i in range(4)]
    assert len(set(texts)) == 4  # concurrent requests do not share a prompt
    for text in texts:
        assert 1800 <= count(text) <= 2600
        assert "```python\ndef " in text and "multiply by 100" in text
