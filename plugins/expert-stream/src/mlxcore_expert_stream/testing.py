"""Helpers for tests and benchmarks of expert streaming: a test model written as mlx-lm
saves it (experts stacked, optionally quantized) and the bytes of its routed experts."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mlxcore_expert_stream.store import ExpertFiles


def mlx_lm_checkpoint(
    source: Path, target: Path, bits: int | None = None, group_size: int = 32
) -> Path:
    """``source`` loaded by mlx-lm and saved to ``target`` by its own ``save`` (quantized
    to ``bits`` when given), with the chat template copied; done once (an existing
    ``target`` is returned as it is). mlx-lm drops ``mtp.*`` tensors on the way."""
    from mlx_lm import load
    from mlx_lm.utils import quantize_model, save

    if not target.exists():
        loaded: Any = load(str(source), return_config=True)
        model, tokenizer, config = loaded
        if bits is not None:
            model, config = quantize_model(model, config, group_size, bits)
        save(target, source, model, tokenizer, config)
        template = source / "chat_template.jinja"
        if template.exists():
            shutil.copy(template, target / template.name)
    return target


def routed_bytes(folder: Path) -> int:
    """Bytes of the routed experts in ``folder`` (mlx-lm's ``switch_mlp`` tensors, and
    gpt-oss's ``mlp.experts``)."""
    files = ExpertFiles(folder)
    try:
        return sum(
            t.expert_bytes * t.shape[0]
            for n, t in files.tensors.items()
            if ".switch_mlp." in n or ".mlp.experts." in n
        )
    finally:
        files.close()
