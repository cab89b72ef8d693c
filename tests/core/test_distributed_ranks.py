"""Two ring ranks on 127.0.0.1 split a float32 test model (tensor or pipeline parallel)
and generate greedy tokens identical to one process: the ground the distributed engine
is built on. Each case starts two processes, bounded in time and stopped by PID."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxcore.distributed.plan import PIPELINE, TENSOR, plan_parallel
from mlxcore.testing.ranks import greedy_alone, run_ranks

pytestmark = pytest.mark.xdist_group("ranks")

PROMPTS = [[300, 301, 302, 303], [1000 + i for i in range(40)], [7, 8, 9]]


@pytest.mark.parametrize(
    ("family", "mode"),
    [pytest.param("tiny_qwen3", TENSOR, marks=pytest.mark.long),
     pytest.param("tiny_llama", TENSOR, marks=pytest.mark.long), ("tiny_qwen3_5", TENSOR),
     pytest.param("tiny_qwen3_5", PIPELINE, marks=pytest.mark.long)],
)  # fmt: skip
def test_two_ranks_generate_what_one_process_does(
    family: str, mode: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    model = request.getfixturevalue(family)
    plan_parallel(model, mode, 2)
    prompts = [",".join(map(str, p)) for p in PROMPTS]
    args = ["-m", "mlxcore.testing.ranks", str(model), mode, "12", *prompts]
    report = run_ranks(args, 2, tmp_path, timeout=180).report()
    assert report["size"] == 2
    assert report["tokens"] == greedy_alone(model, PROMPTS, 12)
