"""Load a model split over a group, as mlx-lm's ``sharded_load`` does for a local folder.

``sharded_load`` also works out which safetensors files a pipeline stage needs, from
``model.safetensors.index.json``, to download only those; for a local folder the lazy
load below reads only the arrays the rank keeps, so an index is not needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlxcore.distributed.plan import PIPELINE, TENSOR


def split_model(model: Any, mode: str, group: Any) -> None:
    """Keep this rank's share of ``model`` (loaded lazily: nothing read yet), ``mode``
    parallel over ``group``, with mlx-lm's own ``shard`` / ``pipeline``."""
    if mode == TENSOR:
        model.shard(group)
    elif mode == PIPELINE:
        model.model.pipeline(group)
    else:
        raise ValueError(f"unknown parallel mode {mode!r}")


def barrier(group: Any) -> None:
    """Return once every rank of ``group`` got here."""
    import mlx.core as mx

    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))


def load_split(path: Path | str, mode: str, group: Any) -> Any:
    """The model in ``path``, split ``mode`` parallel over ``group``, its rank's
    parameters evaluated; returns after every rank has loaded."""
    import mlx.core as mx
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(path), lazy=True, strict=False)
    split_model(model, mode, group)
    mx.eval(model.parameters())
    barrier(group)
    return model
