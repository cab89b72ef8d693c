"""Qwen3.5 test checkpoints laid out like the official ones, multi-token-prediction head included.

Real Qwen3.5 checkpoints (``Qwen3_5ForConditionalGeneration``) nest the text model's
config under ``text_config``, name tensors ``model.language_model.*``, keep PyTorch's
conv1d layout, store zero-centred RMSNorm weights and carry an ``mtp.*`` head that
mlx-lm's loader drops but speculative decoders use. This module writes the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlxcore.testing.model_specs import TokenIds

QWEN3_5_SIZES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # 3 GatedDeltaNet layers + 1 full-attention layer (full_attention_interval=4).
        # Linear key/value head dims are multiples of 32 (Metal's gated-delta kernel).
        "tiny": MappingProxyType(
            {
                "hidden_size": 64,
                "intermediate_size": 192,
                "num_hidden_layers": 4,
                "full_attention_interval": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 32,
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 4,
                "linear_key_head_dim": 32,
                "linear_value_head_dim": 32,
                "linear_conv_kernel_dim": 4,
                "mtp_num_hidden_layers": 1,
            }
        ),
        "small": MappingProxyType(
            {
                "hidden_size": 512,
                "intermediate_size": 1536,
                "num_hidden_layers": 8,
                "full_attention_interval": 4,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "head_dim": 64,
                "linear_num_key_heads": 4,
                "linear_num_value_heads": 8,
                "linear_key_head_dim": 64,
                "linear_value_head_dim": 64,
                "linear_conv_kernel_dim": 4,
                "mtp_num_hidden_layers": 1,
            }
        ),
    }
)


QWEN3_5_MOE_SIZES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # The tiny Qwen3.5 with a sparse MoE block in every layer (and in the MTP layer):
        # 4 experts, 2 per token, and a gated shared expert.
        "tiny": MappingProxyType(
            {
                **QWEN3_5_SIZES["tiny"],
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 48,
                "shared_expert_intermediate_size": 48,
                "decoder_sparse_step": 1,
            }
        ),
    }
)


def qwen3_5_config(fields: dict[str, Any], ids: TokenIds) -> dict[str, Any]:
    """The nested config of a real ``Qwen3_5ForConditionalGeneration`` checkpoint."""
    text: dict[str, Any] = {
        "model_type": "qwen3_5_text",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "attention_bias": False,
        "attn_output_gate": True,
        "tie_word_embeddings": True,
        "mtp_use_dedicated_embeddings": False,
        "dtype": "float32",
    }
    text.update(ids.config_fields())
    text.update(fields)
    rotary_pairs = int(text["head_dim"] * 0.25) // 2
    text.setdefault(
        "rope_parameters",
        {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": _split_mrope(rotary_pairs),
        },
    )
    interval = int(text["full_attention_interval"])
    text.setdefault(
        "layer_types",
        [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(int(text["num_hidden_layers"]))
        ],
    )
    config: dict[str, Any] = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": text["tie_word_embeddings"],
        "torch_dtype": "float32",
    }
    config.update(ids.config_fields())
    return config


def _split_mrope(pairs: int) -> list[int]:
    """Split rotary frequency pairs over (temporal, height, width) like [11, 11, 10]."""
    base, extra = divmod(pairs, 3)
    return [base + (1 if i < extra else 0) for i in range(3)]


_QWEN3_5_NORM_SUFFIXES = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
    "model.norm.weight",
)
_QWEN3_5_MTP_NORM_SUFFIXES = (
    *_QWEN3_5_NORM_SUFFIXES,
    "mtp.norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)


def export_qwen3_5(model: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Write Qwen3.5 the way the official (Hugging Face) checkpoints are laid out.

    ``model.language_model.*`` / ``lm_head.*`` names, PyTorch conv1d layout
    ``[channels, 1, kernel]``, zero-centred RMSNorm weights (stored as ``w - 1``; the
    model computes with ``1 + w``) and a multi-token-prediction head ``mtp.*`` (one
    full-attention decoder layer) that mlx-lm's loader drops. mlx-lm's ``sanitize``
    recognises this layout by the conv1d shape and converts it back on load.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten

    tensors: dict[str, Any] = {}
    for name, value in dict(tree_flatten(model.parameters())).items():
        if name.startswith("language_model.model."):
            name = "model.language_model." + name.removeprefix("language_model.model.")
        elif name.startswith("language_model.lm_head."):
            name = name.removeprefix("language_model.")
        if name.endswith("conv1d.weight"):
            value = mx.swapaxes(value, 1, 2)
        tensors[name] = value

    text_config = config["text_config"]
    for name, value in make_qwen3_5_mtp(model, text_config).items():
        tensors[f"mtp.{name}"] = value

    for name, value in list(tensors.items()):
        if value.ndim == 1 and name.endswith(_QWEN3_5_MTP_NORM_SUFFIXES):
            tensors[name] = value - 1.0
    return tensors


def make_qwen3_5_mtp(model: Any, text_config: dict[str, Any]) -> dict[str, Any]:
    """Random weights of a Qwen3.5 MTP head, named as in the checkpoints (minus ``mtp.``).

    ``fc`` [hidden, 2*hidden] mixes the normed token embedding and the normed last hidden
    state; ``layers.N`` are full-attention decoder layers of the main model's kind.
    """
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_5

    args = model.language_model.args
    hidden = args.hidden_size
    eps = args.rms_norm_eps
    depth = int(text_config.get("mtp_num_hidden_layers", 1))
    full_attention_idx = args.full_attention_interval - 1

    class MTPHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2 * hidden, hidden, bias=False)
            self.pre_fc_norm_embedding = nn.RMSNorm(hidden, eps=eps)
            self.pre_fc_norm_hidden = nn.RMSNorm(hidden, eps=eps)
            self.layers = [
                qwen3_5.DecoderLayer(args, layer_idx=full_attention_idx) for _ in range(depth)
            ]
            self.norm = nn.RMSNorm(hidden, eps=eps)

    head = MTPHead()
    for layer in head.layers:
        if layer.is_linear:  # pragma: no cover - guards a change of mlx-lm's rule
            raise RuntimeError("the MTP layer must be a full-attention layer")
    return dict(tree_flatten(head.parameters()))


def qwen3_5_moe_config(fields: dict[str, Any], ids: TokenIds) -> dict[str, Any]:
    """The config of a real ``Qwen3_5MoeForConditionalGeneration`` checkpoint."""
    config = qwen3_5_config(fields, ids)
    config["architectures"] = ["Qwen3_5MoeForConditionalGeneration"]
    config["model_type"] = "qwen3_5_moe"
    config["text_config"]["model_type"] = "qwen3_5_moe_text"
    return config


def export_qwen3_5_moe(model: Any, config: dict[str, Any]) -> dict[str, Any]:
    """:func:`export_qwen3_5`, with each MoE block's experts stored fused as the official
    checkpoints store them: ``mlp.experts.gate_up_proj`` ``[experts, 2 * inter, hidden]``
    (gate rows, then up rows) and ``mlp.experts.down_proj`` ``[experts, hidden, inter]``,
    in the main layers and in the MTP layer alike."""
    import mlx.core as mx

    tensors = export_qwen3_5(model, config)
    out: dict[str, Any] = {}
    for name, value in tensors.items():
        if name.endswith(".mlp.switch_mlp.gate_proj.weight"):
            prefix = name.removesuffix("switch_mlp.gate_proj.weight")
            up = tensors[f"{prefix}switch_mlp.up_proj.weight"]
            out[f"{prefix}experts.gate_up_proj"] = mx.concatenate([value, up], axis=-2)
        elif name.endswith(".mlp.switch_mlp.down_proj.weight"):
            out[name.removesuffix("switch_mlp.down_proj.weight") + "experts.down_proj"] = value
        elif not name.endswith(".mlp.switch_mlp.up_proj.weight"):
            out[name] = value
    return out
