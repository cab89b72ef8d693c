"""Start-up checks of distributed serving, before any weight is read: each mistake is
one line that says what does not fit and what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlxcore.distributed.plan import PIPELINE, TENSOR, check_backend, plan_parallel
from mlxcore.errors import UsageError


@pytest.mark.parametrize(
    ("family", "mode", "layers"),
    [("tiny_qwen3", TENSOR, 2), ("tiny_llama", TENSOR, 2), ("tiny_qwen3_5", TENSOR, 4),
     ("tiny_qwen3_5", PIPELINE, 4)],
)  # fmt: skip
def test_models_that_split_get_a_plan(
    family: str, mode: str, layers: int, request: pytest.FixtureRequest
) -> None:
    plan = plan_parallel(request.getfixturevalue(family), mode, 2)
    assert (plan.mode, plan.size, plan.layers) == (mode, 2, layers)
    assert "over 2 ranks" in plan.describe()


def test_heads_that_do_not_divide_are_refused_in_one_line(mlxcore_model_factory: Any) -> None:
    # llama's own shard() floors the head count and fails only at the first forward pass
    odd = mlxcore_model_factory("llama", num_attention_heads=6, num_key_value_heads=3)
    plan_parallel(odd, TENSOR, 3)  # 6 and 3 divide by 3
    with pytest.raises(UsageError) as refused:
        plan_parallel(odd, TENSOR, 2)
    message = str(refused.value)
    assert "num_key_value_heads = 3 does not divide by 2 ranks" in message
    assert "\n" not in message


def test_pipeline_on_a_model_without_it_is_refused(tiny_llama: Path) -> None:
    with pytest.raises(UsageError, match=r"llama: mlx-lm has no pipeline\(\) for it; use --tensor"):
        plan_parallel(tiny_llama, PIPELINE, 2)


def test_more_ranks_than_layers_is_refused(tiny_qwen3_5: Path) -> None:
    with pytest.raises(UsageError, match="4 layers cannot be split over 8 ranks"):
        plan_parallel(tiny_qwen3_5, PIPELINE, 8)


def test_one_rank_or_an_unknown_mode_is_refused(tiny_qwen3: Path) -> None:
    with pytest.raises(UsageError, match="at least 2 ranks"):
        plan_parallel(tiny_qwen3, TENSOR, 1)
    with pytest.raises(UsageError, match="unknown parallel mode"):
        plan_parallel(tiny_qwen3, "expert", 2)


def test_backends_this_build_lacks_are_refused_naming_the_usable_ones() -> None:
    check_backend("ring")  # works everywhere, Linux included
    with pytest.raises(UsageError, match="unknown backend"):
        check_backend("tcp")
    missing = [b for b in ("jaccl", "nccl", "mpi") if not mx.distributed.is_available(b)]
    if not missing:
        pytest.skip("every backend is available on this machine")
    with pytest.raises(UsageError, match=r"not available .*\(available: .*ring"):
        check_backend(missing[0])
