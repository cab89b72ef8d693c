"""Whether a model can be split over a group of ranks, decided before a weight is read.

mlx-lm splits a model two ways: tensor parallel through the model's ``shard(group)``
(every linear layer's heads or hidden units divided among the ranks) and pipeline
parallel through ``model.model.pipeline(group)`` (contiguous runs of layers per rank).
Neither checks everything it relies on: Llama's ``shard`` floors ``n_heads // N`` and
fails only at the first forward pass with a shape error. :func:`plan_parallel` reads the
checkpoint's ``config.json`` and the model's class (built lazily: no weight is read)
and answers with a :class:`ParallelPlan` or a one-line :class:`~mlxcore.errors.UsageError`
that says what to do instead.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

from mlxcore.errors import UsageError

TENSOR = "tensor"
PIPELINE = "pipeline"
MODES = (TENSOR, PIPELINE)

BACKENDS = ("ring", "jaccl", "mpi", "nccl")
"""mlx.distributed's backends, as ``mx.distributed.init(backend=...)`` names them."""

TENSOR_DIVISIBLE = (
    "num_attention_heads",
    "num_key_value_heads",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)
"""Config fields that tensor parallelism divides among the ranks (when present)."""


@attrs.frozen
class ParallelPlan:
    """How one model is split: ``mode`` over ``size`` ranks."""

    mode: str
    size: int
    model_type: str
    layers: int

    def describe(self) -> str:
        """One line for the start-up log."""
        how = "heads and hidden units split" if self.mode == TENSOR else "layers split"
        return (
            f"{self.model_type}, {self.layers} layers, {self.mode} parallel over "
            f"{self.size} ranks ({how})"
        )


def text_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields: a vision-language checkpoint nests them in
    ``text_config``; the top level fills in what it lacks."""
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else dict(config)


def plan_parallel(path: Path | str, mode: str, size: int) -> ParallelPlan:
    """Check that the model in ``path`` can run ``mode`` parallel over ``size`` ranks.

    Raises:
        UsageError: one line naming what does not fit and what to do.
    """
    from mlx_lm.utils import load_config, load_model

    if mode not in MODES:
        raise UsageError(f"unknown parallel mode {mode!r}: use one of {', '.join(MODES)}")
    if size < 2:
        raise UsageError(
            f"distributed serving needs at least 2 ranks, this group has {size}: "
            "start the ranks with `mlxcore launch` or serve without --distributed"
        )
    folder = Path(path)
    fields = text_fields(load_config(folder))
    model_type = str(fields.get("model_type", "?"))
    model, _ = load_model(folder, lazy=True, strict=False)  # classes only: nothing evaluated
    inner = getattr(model, "model", None)
    layers = len(getattr(inner, "layers", None) or getattr(model, "layers", []))
    if mode == TENSOR:
        if not hasattr(model, "shard"):
            hint = "; use --pipeline-parallel" if hasattr(inner, "pipeline") else ""
            raise UsageError(f"{model_type}: mlx-lm has no tensor-parallel shard() for it{hint}")
        for name in TENSOR_DIVISIBLE:
            value = fields.get(name)
            if isinstance(value, int) and value % size:
                raise UsageError(
                    f"{model_type}: {name} = {value} does not divide by {size} ranks, which "
                    "tensor parallel needs; use a group size that divides it"
                    + (" or --pipeline-parallel" if hasattr(inner, "pipeline") else "")
                )
    else:
        if not hasattr(inner, "pipeline"):
            hint = "; use --tensor-parallel" if hasattr(model, "shard") else ""
            raise UsageError(f"{model_type}: mlx-lm has no pipeline() for it{hint}")
        if layers < size:
            raise UsageError(
                f"{model_type}: {layers} layers cannot be split over {size} ranks "
                "(each rank needs at least one)"
            )
    return ParallelPlan(mode=mode, size=size, model_type=model_type, layers=layers)


def check_backend(backend: str) -> None:
    """Refuse a backend this platform's mlx cannot run, naming the ones it can."""
    import mlx.core as mx

    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if not mx.distributed.is_available(backend):
        usable = [b for b in BACKENDS if mx.distributed.is_available(b)] or ["none"]
        raise UsageError(
            f"backend {backend!r} is not available in this mlx build on this platform "
            f"(available: {', '.join(usable)})"
        )


RANK_LOCAL_SETTINGS = frozenset({"model", "host", "port", "log_level", "api_key", "api_keys_file"})
"""Settings that may differ between ranks (the model's path: each machine has its own
folder, compared by content instead)."""


def fingerprint(folder: Path | str, settings: dict[str, Any], plugins: list[str]) -> int:
    """What the ranks must agree on before loading, as one number: the model folder's
    ``config.json`` and weight files (names and sizes), the settings that change the
    engine step, and the enabled plugins."""
    root = Path(folder)
    digest = hashlib.sha256()
    config_file = root / "config.json"
    digest.update(config_file.read_bytes() if config_file.exists() else b"")
    for weights in sorted(root.glob("*.safetensors")):
        digest.update(f"{weights.name}:{weights.stat().st_size};".encode())
    shared = {k: v for k, v in settings.items() if k not in RANK_LOCAL_SETTINGS}
    digest.update(json.dumps(shared, sort_keys=True, default=str).encode())
    digest.update(",".join(sorted(plugins)).encode())
    return int.from_bytes(digest.digest()[:4], "little") & 0x7FFFFFFF


def check_agreement(values: list[int]) -> None:
    """Refuse to start when a rank's :func:`fingerprint` differs from rank 0's."""
    differ = [rank for rank, value in enumerate(values) if value != values[0]]
    if differ:
        raise UsageError(
            f"rank(s) {', '.join(map(str, differ))} disagree with rank 0 on the model files, "
            "the engine flags or the plugins: start every rank with the same command and model"
        )
