"""``mlxcore bench``: a real run on a tiny model (real mlx-lm, real server subprocess, real
HTTP), checking that every section of the JSON is there with positive numbers.

Speed is never asserted: only that each measurement ran and produced sane values.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mlxcore.bench import workloads
from mlxcore.bench.options import QUICK, add_bench_options, settings_from_args
from mlxcore.cli import options as cli_options

pytestmark = pytest.mark.timeout(180)


def parse_bench(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_options.add_common(parser)
    cli_options.add_model_options(parser)
    add_bench_options(parser)
    return parser.parse_args(list(argv))


def test_settings_forward_changed_engine_flags_to_the_server() -> None:
    args = parse_bench(
        "some/model",
        "--max-num-seqs",
        "8",
        "--prefix-cache-size",
        "0",
        "--plugin",
        "hello",
        "--serve-arg=--served-model-name=bench",
        "--quick",
    )
    settings = settings_from_args(args)
    assert settings.model == "some/model"
    assert settings.serve_args == (
        "--max-num-seqs",
        "8",
        "--prefix-cache-size",
        "0",
        "--plugin",
        "hello",
        "--served-model-name=bench",
    )
    assert (settings.max_tokens, settings.repeats) == (QUICK.max_tokens, QUICK.repeats)
    assert settings.concurrency == QUICK.concurrency


def test_explicit_flags_override_quick() -> None:
    settings = settings_from_args(
        parse_bench("--quick", "--max-tokens", "7", "--concurrency", "2,3")
    )
    assert settings.model is None
    assert settings.max_tokens == 7
    assert settings.concurrency == (2, 3)
    assert settings.serve_args == ()


def test_long_prefixes_reach_the_target_and_never_repeat() -> None:
    rng = random.Random(0)

    def count(text: str) -> int:
        return len(text.split())

    first, word1 = workloads.long_prefix(count, 300, rng)
    second, word2 = workloads.long_prefix(count, 300, rng)
    assert count(first) >= 300
    assert word1 in first.split(".")[0]
    assert word1 != word2
    assert first[:40] != second[:40]


def _positive(section: dict[str, Any], *keys: str) -> None:
    for key in keys:
        assert section[key] > 0, (key, section)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize(
    "mode", [pytest.param("interleaved", marks=pytest.mark.long), "sequential"]
)
def test_bench_runs_every_measurement_on_a_tiny_model(
    tiny_llama: Path, tmp_path: Path, mode: str
) -> None:
    out_file = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxcore",
            "bench",
            str(tiny_llama),
            "--json",
            "--output",
            str(out_file),
            "--max-tokens",
            "12",
            "--repeats",
            "1",
            "--concurrency",
            "1,2",
            "--prefix-tokens",
            "150",
            "--followup-max-tokens",
            "3",
            "--log-level",
            "warning",
            *(["--sequential"] if mode == "sequential" else []),
        ],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert json.loads(out_file.read_text()) == result

    machine = result["machine"]
    assert machine["cpu_count"] > 0
    assert machine["mlx"] and machine["mlx_lm"] and machine["platform"]
    assert isinstance(machine["openblas_preloaded"], bool)
    assert machine["server_openblas_preloaded"] in (machine["openblas_preloaded"], None)

    model = result["model"]
    assert model["path"] == str(tiny_llama.resolve())
    assert model["dtype"] and model["parameters"] > 0

    for name in ("in_process", "http_single"):
        part = result[name]
        _positive(part, "decode_tok_s", "ttft_s", "prompt_tokens", "completion_tokens")
        assert part["completion_tokens"] <= 12
    assert result["in_process"]["prompt_tokens"] == result["http_single"]["prompt_tokens"]
    assert result["settings"]["sequential"] is (mode == "sequential")
    _positive(result["in_process"]["long_prompt"], "ttft_s", "prompt_tokens")

    levels = [row["concurrency"] for row in result["concurrency"]]
    assert levels == [1, 2]
    for row in result["concurrency"]:
        _positive(row, "aggregate_tok_s", "wall_s", "completion_tokens", "ttft_median_s")

    prefix = result["prefix_cache"]
    _positive(prefix, "cold_ttft_s", "cached_ttft_s", "prompt_tokens", "cached_tokens")
    assert prefix["prompt_tokens"] >= 150
    assert prefix["cached_tokens"] > prefix["cold_cached_tokens"]

    ratios = result["ratios"]
    for key in ("http_vs_in_process_decode", "cold_vs_cached_ttft"):
        assert ratios[key] > 0
    assert ratios["conc8_vs_conc1_aggregate"] is None  # concurrency 8 was not measured
    names = {t["name"]: t for t in result["targets"]}
    assert set(names) == {
        "decode_http_vs_in_process",
        "aggregate_conc8_vs_conc1",
        "ttft_cold_vs_cached",
    }
    assert names["aggregate_conc8_vs_conc1"]["passed"] is None
    assert isinstance(names["ttft_cold_vs_cached"]["passed"], bool)
