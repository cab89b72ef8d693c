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

from mlxcore.bench.peer import Peer, format_peer, parse_peers, summarize, turn_order
from mlxcore.bench.server import ServerProcess
from mlxcore.errors import UsageError

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
        ratios = summary["ratios"]["peer"]  # one unnamed peer: named "peer"
        assert "ttft_p50_s" in ratios or "long_ttft_s" in ratios, name
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
    assert out["ratios"]["peer"]["ttft_p50_s"] == 0.5  # median of 0.5, 0.25, 1.0
    assert out["ratios"]["peer"]["aggregate_tok_s"] == 1.75  # a zero peer value: no ratio
    assert out["mlxcore"]["aggregate_tok_s"] == 30.0 and out["peer"]["ttft_p50_s"] == 3.0


def test_several_peers_get_a_ratio_each_and_rotate_turns() -> None:
    rounds = [
        {"mlxcore": {"aggregate_tok_s": 30.0}, "a": {"aggregate_tok_s": 10.0},
         "b": {"aggregate_tok_s": 60.0}},
        {"mlxcore": {"aggregate_tok_s": 20.0}, "a": {"aggregate_tok_s": 10.0},
         "b": {"aggregate_tok_s": 40.0}},
    ]  # fmt: skip
    out = summarize(rounds)
    assert out["ratios"] == {"a": {"aggregate_tok_s": 2.5}, "b": {"aggregate_tok_s": 0.5}}
    sides = ("mlxcore", "a", "b")
    orders = [turn_order(sides, i) for i in range(3)]
    assert orders == [("mlxcore", "a", "b"), ("a", "b", "mlxcore"), ("b", "mlxcore", "a")]
    assert turn_order(("mlxcore", "peer"), 1) == ("peer", "mlxcore")  # two sides alternate
    result = {
        "machine": {
            "cpu_count": 2, "platform": "Linux", "mlx": "0.32.4", "mlx_device": "Device(cpu, 0)",
            "server_openblas_preloaded": True, "load_average_start": [0, 0, 0],
            "load_average_end": [1, 1, 1],
        },
        "settings": {"serve_args": [], "rounds": 2},
        "peers": [{"name": n, "url": f"http://{n}", "model": "m"} for n in ("a", "b")],
        "model": {"path": "/m"},
        "workloads": {"uniform-16": out},
    }  # fmt: skip
    table = format_peer(result).splitlines()
    header = next(line for line in table if line.startswith("workload"))
    assert header.split() == ["workload", "metric", "mlxcore", "a", "b", "vs", "a", "vs", "b"]
    row = next(line for line in table if "aggregate_tok_s" in line).split()
    assert row == ["uniform-16", "aggregate_tok_s", "25.000", "10.000", "50.000", "2.50x", "0.50x"]


def test_peer_names_urls_and_models_are_parsed() -> None:
    peers = parse_peers(
        ["mlx-lm=http://127.0.0.1:8090/", "http://127.0.0.1:8091"],
        ["shared-name", "mlx-lm=/models/x"],
    )
    assert peers == (
        Peer("mlx-lm", "http://127.0.0.1:8090", "/models/x"),
        Peer("peer2", "http://127.0.0.1:8091", "shared-name"),
    )
    for urls, models in (
        (["127.0.0.1:8090"], []),  # no scheme
        (["mlxcore=http://h:1"], []),  # the name of our own column
        (["a=http://h:1", "a=http://h:2"], []),
        (["a=http://h:1"], ["b=m"]),  # a model for a peer that is not there
    ):
        with pytest.raises(UsageError):
            parse_peers(urls, models)


def test_the_peers_script_parses_and_explains_itself() -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "peers"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "install | start MODEL | stop" in done.stderr
    text = script.read_text()  # the versions docs/benchmarks.md reports
    assert all(pin in text for pin in ("mlx-lm==0.32.2", "vllm-mlx==0.6.0", "rapid-mlx==0.16.10"))
