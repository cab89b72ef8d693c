"""What ``mlxcore bench --peer`` keeps of each server's /metrics: the weights, and for a
distributed group its ranks, per-rank weights and collective time per step."""

from __future__ import annotations

from mlxcore.bench.peer import format_peer, server_gauges
from mlxcore.testing.server import Server


def test_a_single_server_reports_its_weights_and_nothing_distributed(
    scripted_server: Server,
) -> None:
    gauges = server_gauges(scripted_server.base_url)
    assert gauges["memory_weights_bytes"] > 0
    assert not [name for name in gauges if name.startswith("distributed")]
    assert server_gauges("http://127.0.0.1:9") == {}  # nothing listens: no gauges


def test_the_report_shows_a_groups_ranks_collective_time_and_shares() -> None:
    result = {
        "machine": {
            "cpu_count": 2, "platform": "Linux", "mlx": "0.32.4",
            "server_openblas_preloaded": True, "load_average_start": [0, 0, 0],
            "load_average_end": [1, 1, 1],
        },
        "settings": {"serve_args": [], "rounds": 2},
        "peers": [{"name": "peer", "url": "http://group", "model": "target"}],
        "model": {"path": "/m"},
        "workloads": {},
        "server_gauges": {
            "mlxcore": {"memory_weights_bytes": 4.0e8},
            "peer": {
                "distributed_ranks": 2.0, "distributed_steps": 10.0,
                "distributed_collective_ms_per_step": 16.7038,
                "distributed_rank0_weights_bytes": 201326592.0,
                "distributed_rank1_weights_bytes": 201326592.0,
                "memory_weights_bytes": 201404424.0,
            },
        },
    }  # fmt: skip
    text = format_peer(result)
    line = "peer: 2 ranks, collective 16.704 ms per step, weights per rank 192.0 MiB, 192.0 MiB"
    assert line in text.splitlines()
    assert "mlxcore:" not in text  # a single server has no such line
