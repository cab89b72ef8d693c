"""Test adapters: real mlx-lm adapter folders with seeded weights, written the way
``mlx_lm.lora`` saves them (``linear_to_lora_layers`` on the real model, then its
trainable parameters and ``adapter_config.json``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten


def write_adapter(
    model_path: str | Path,
    out: str | Path,
    *,
    rank: int = 8,
    scale: float = 10.0,
    num_layers: int = -1,
    keys: Sequence[str] | None = None,
    seed: int = 0,
    strength: float = 0.05,
) -> Path:
    """An adapter folder for the model at ``model_path`` in ``out``: LoRA pairs of ``rank``
    on the last ``num_layers`` layers (``-1``: all) for ``keys`` (mlx-lm's per-layer
    module names, e.g. ``self_attn.q_proj``; ``None``: mlx-lm's default, every linear
    layer), ``lora_b`` drawn with ``strength`` so the adapter visibly changes the output."""
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load

    model = load(str(model_path))[0]
    model.freeze()
    params: dict[str, Any] = {"rank": rank, "scale": scale, "dropout": 0.0}
    if keys is not None:
        params["keys"] = list(keys)
    layers = len(model.layers) if num_layers < 0 else num_layers
    mx.random.seed(seed)
    linear_to_lora_layers(model, layers, params)
    trainable = dict(tree_flatten(model.trainable_parameters()))
    weights = {
        name: (mx.random.normal(value.shape) * strength).astype(value.dtype)
        if name.endswith("lora_b")
        else value
        for name, value in trainable.items()
    }
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "adapters.safetensors"), weights)
    config = {"fine_tune_type": "lora", "num_layers": layers, "lora_parameters": params}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder
