"""Helpers for the specprefill tests: drive prefill generators, and a dense reference
that masks dropped tokens out of attention."""

from __future__ import annotations

import importlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcore.engine.strategies import run_to_completion

drive = run_to_completion
"""Run a prefill generator to completion; return its result."""


def prompt_ids(n: int, salt: int = 0) -> tuple[int, ...]:
    """A deterministic prompt of ``n`` ordinary token ids."""
    return tuple(int((i * 37 + salt * 101) % 5000 + 10) for i in range(n))


def masked_reference(model: Any, tokens: Sequence[int], kept: Sequence[int]) -> mx.array:
    """Logits ``(len(tokens), vocab)`` of a dense pass over ``tokens`` at their true
    positions (0, 1, ...) in which every query sees only kept keys (and itself).

    Rows at kept positions equal what a sparse prefill of ``kept`` must produce;
    a row past the prompt is a decode step at its true position. Uses the model's own
    layers (mlx-lm's ``TransformerBlock``), so it only fits pure-attention models.
    GPT-OSS's sliding-window layers also see only keys less than a window back.
    """
    n = len(tokens)
    keep = mx.zeros((n,), dtype=mx.bool_)
    keep[mx.array(list(kept))] = True
    rows = mx.arange(n)[:, None]
    cols = mx.arange(n)[None]
    mask = (cols <= rows) & (keep[None] | (cols == rows))
    inner = model.model
    kinds = getattr(inner, "layer_types", None) or ["full_attention"] * len(model.layers)
    window = getattr(inner, "window_size", n)
    sliding = mask & (cols > rows - window)
    h = inner.embed_tokens(mx.array(list(tokens))[None])
    for layer, kind in zip(model.layers, kinds, strict=True):
        h = layer(h, sliding if kind == "sliding_attention" else mask, None)
    out = inner.norm(h)
    head = getattr(model, "lm_head", None)
    return (head(out) if head is not None else inner.embed_tokens.as_linear(out))[0]


def build_gpt_oss(folder: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """A tiny seeded GPT-OSS model (mlx-lm's ``gpt_oss``: alternating sliding-window
    and full attention, attention sinks, MoE) in ``folder``, with the tokenizer and
    chat template of the test model at ``tokenizer_from``; ``mlx_lm.load`` loads it."""
    config = {
        "model_type": "gpt_oss",
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 8,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "hidden_size": 64,
        "intermediate_size": 64,
        "head_dim": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_theta": 150000,
    }
    return build_model_folder(folder, tokenizer_from, config, seed)


def build_nemotron_h(folder: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """A tiny seeded Nemotron-H model (Mamba-2, attention without RoPE, MLP blocks)."""
    return build_model_folder(folder, tokenizer_from, _nemotron_h_config(["M", "*", "-"]), seed)


def build_nemotron_h_moe(folder: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """A tiny seeded Nemotron-H model with two Mamba-2 blocks and a routed MoE block
    (4 experts, 2 per token, one shared expert)."""
    config = _nemotron_h_config(["M", "*", "M", "E"])
    config.update(
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
    )
    return build_model_folder(folder, tokenizer_from, config, seed)


def _nemotron_h_config(pattern: list[str]) -> dict[str, Any]:
    return {
        "model_type": "nemotron_h",
        "hybrid_override_pattern": pattern,
        "hidden_size": 64,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "attention_bias": False,
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "mamba_proj_bias": False,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_groups": 1,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "use_bias": False,
        "use_conv_bias": True,
    }


def build_model_folder(
    folder: Path, tokenizer_from: Path, config: dict[str, Any], seed: int
) -> Path:
    """Write an mlx-lm model folder: ``config`` (plus the vocabulary size and EOS ids
    of the test model at ``tokenizer_from``, whose tokenizer files are copied), and
    seeded random weights of mlx-lm's own class for ``config["model_type"]`` (attention
    sinks, where the class has them, are random too)."""
    from mlx.utils import tree_flatten

    base = json.loads((tokenizer_from / "config.json").read_text())
    config = {**config, "vocab_size": base["vocab_size"], "eos_token_id": base["eos_token_id"]}
    folder.mkdir(parents=True, exist_ok=True)
    for item in tokenizer_from.iterdir():
        if item.name not in ("config.json", "model.safetensors") and item.is_file():
            shutil.copy(item, folder / item.name)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    for layer in model.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "sinks"):
            attn.sinks = mx.random.normal(attn.sinks.shape)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
