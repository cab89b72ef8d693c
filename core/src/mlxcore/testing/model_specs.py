"""The registry of test-model architectures that :func:`mlxcore.testing.build_test_model` builds.

A :class:`ModelSpec` says, for one architecture name (``"llama"``, ``"qwen3_5"``...), which
tokenizer family and chat template the model ships with, the shapes of each size
(``"tiny"``, ``"small"``), how to turn those shapes into the family's ``config.json`` and,
when the real checkpoints hold more than the mlx-lm class does (Qwen3.5's MTP head), how to
write the weights. Adding an architecture is one :func:`register_model_spec` call.

This module imports neither mlx nor transformers at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mlxcore.testing.qwen3_5_checkpoint import (
    QWEN3_5_MOE_SIZES,
    QWEN3_5_SIZES,
    export_qwen3_5,
    export_qwen3_5_moe,
    qwen3_5_config,
    qwen3_5_moe_config,
)

BUILDER_VERSION = 1
"""Bump when the output of a build changes for the same arguments (invalidates caches)."""


@dataclass(frozen=True)
class TokenizerFamily:
    """A real tokenizer shipped in ``mlxcore/testing/assets/<asset_dir>``.

    Attributes:
        name: short name (``"qwen3"``, ``"gemma4"``).
        asset_dir: folder under ``assets/`` holding ``tokenizer.json[.xz]`` and
            ``tokenizer_config.json[.xz]``.
        added_special_tokens: tokens appended to the base vocabulary as special tokens
            (e.g. Gemma 4's turn markers on top of the Gemma 3 vocabulary).
        eos_tokens: the tokens whose ids go into ``eos_token_id`` (first one is the
            tokenizer's ``eos_token``).
        bos_token: the token whose id goes into ``bos_token_id``, if any.
        pad_token: the token whose id goes into ``pad_token_id``, if any.
        config_updates: keys set in ``tokenizer_config.json`` (``None`` deletes a key).
    """

    name: str
    asset_dir: str
    added_special_tokens: tuple[str, ...] = ()
    eos_tokens: tuple[str, ...] = ()
    bos_token: str | None = None
    pad_token: str | None = None
    config_updates: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenIds:
    """Ids of a built tokenizer that a ``config.json`` refers to."""

    vocab_len: int
    eos: tuple[int, ...]
    bos: int | None
    pad: int | None

    def config_fields(self) -> dict[str, Any]:
        """``eos_token_id`` (an int, or a list when several), ``bos_token_id``, ``pad_token_id``."""
        eos: int | list[int] = self.eos[0] if len(self.eos) == 1 else list(self.eos)
        out: dict[str, Any] = {"eos_token_id": eos}
        if self.bos is not None:
            out["bos_token_id"] = self.bos
        if self.pad is not None:
            out["pad_token_id"] = self.pad
        return out


ConfigMaker = Callable[[dict[str, Any], TokenIds], dict[str, Any]]
"""(size fields merged with overrides and ``vocab_size``, token ids) -> ``config.json``."""

WeightExporter = Callable[[Any, dict[str, Any]], dict[str, Any]]
"""(instantiated mlx-lm model, ``config.json``) -> tensors to write to ``model.safetensors``."""


@dataclass(frozen=True)
class ModelSpec:
    """How to build one architecture.

    Attributes:
        arch: the registry key, passed to ``build_test_model``.
        tokenizer: the tokenizer family the model ships with.
        chat_template: file name under ``assets/chat-templates/``.
        sizes: size name -> fields of the (text) config for that size.
        make_config: builds the whole ``config.json`` (its ``model_type`` names the
            ``mlx_lm.models`` module that is instantiated).
        export_weights: turns the instantiated model into the checkpoint's tensors;
            ``None`` saves the model's parameters under their mlx-lm names.
        description: one line for humans.
    """

    arch: str
    tokenizer: TokenizerFamily
    chat_template: str
    sizes: Mapping[str, Mapping[str, Any]]
    make_config: ConfigMaker
    export_weights: WeightExporter | None = None
    description: str = ""


MODEL_SPECS: dict[str, ModelSpec] = {}
"""Every registered architecture, by name."""


def register_model_spec(spec: ModelSpec, *, replace: bool = False) -> ModelSpec:
    """Add ``spec`` to :data:`MODEL_SPECS` (``replace=True`` to overwrite a name)."""
    if spec.arch in MODEL_SPECS and not replace:
        raise ValueError(f"a test-model spec named {spec.arch!r} is already registered")
    MODEL_SPECS[spec.arch] = spec
    return spec


def available_architectures() -> list[str]:
    """Names accepted by ``build_test_model``'s ``arch``."""
    return sorted(MODEL_SPECS)


# --------------------------------------------------------------------------- tokenizers

QWEN3_TOKENIZER = TokenizerFamily(
    name="qwen3",
    asset_dir="qwen3-tokenizer",
    eos_tokens=("<|im_end|>", "<|endoftext|>"),
    bos_token="<|endoftext|>",
    pad_token="<|endoftext|>",
)

GEMMA4_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|image|>",
    "<|audio|>",
    "<|video|>",
)
"""Every marker the official Gemma 4 chat template writes (google-gemma-4-31B-it.jinja)."""

GEMMA4_TOKENIZER = TokenizerFamily(
    name="gemma4",
    asset_dir="gemma3-tokenizer",
    added_special_tokens=GEMMA4_SPECIAL_TOKENS,
    eos_tokens=("<eos>", "<turn|>"),
    bos_token="<bos>",
    pad_token="<pad>",
    config_updates={
        "eos_token": "<turn|>",
        # Gemma 3's multimodal processor settings do not describe this text-only tokenizer.
        "processor_class": None,
        "boi_token": None,
        "eoi_token": None,
        "image_token": None,
        "extra_special_tokens": None,
    },
)


# --------------------------------------------------------------------------- llama / qwen3

_DENSE_SIZES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "tiny": MappingProxyType(
            {
                "hidden_size": 64,
                "intermediate_size": 192,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
            }
        ),
        "small": MappingProxyType(
            {
                "hidden_size": 512,
                "intermediate_size": 1536,
                "num_hidden_layers": 4,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "head_dim": 64,
            }
        ),
    }
)


def _llama_config(fields: dict[str, Any], ids: TokenIds) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    config.update(ids.config_fields())
    config.update(fields)
    return config


def _qwen3_config(fields: dict[str, Any], ids: TokenIds) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "max_position_embeddings": 40960,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    config.update(ids.config_fields())
    config.update(fields)
    return config


_QWEN3_MOE_SIZES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # every layer sparse, 16 routed experts, top-2 (Qwen3-30B-A3B's shape, shrunk)
        "tiny": MappingProxyType(
            {
                "hidden_size": 64,
                "intermediate_size": 192,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "num_experts": 16,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 48,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
                "norm_topk_prob": True,
            }
        ),
    }
)


def _qwen3_moe_config(fields: dict[str, Any], ids: TokenIds) -> dict[str, Any]:
    config = _qwen3_config(fields, ids)
    config.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"})
    return config


# --------------------------------------------------------------------------- gemma4_text

_GEMMA4_SIZES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # 3 sliding-window layers + 1 global layer; K=V on global layers like the 31B.
        "tiny": MappingProxyType(
            {
                "hidden_size": 64,
                "intermediate_size": 192,
                "num_hidden_layers": 4,
                "sliding_window_pattern": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_global_key_value_heads": 1,
                "head_dim": 16,
                "global_head_dim": 32,
            }
        ),
        "small": MappingProxyType(
            {
                "hidden_size": 512,
                "intermediate_size": 1536,
                "num_hidden_layers": 6,
                "sliding_window_pattern": 6,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "num_global_key_value_heads": 2,
                "head_dim": 64,
                "global_head_dim": 128,
            }
        ),
    }
)


def _gemma4_text_config(fields: dict[str, Any], ids: TokenIds) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "sliding_window": 512,
        "attention_k_eq_v": True,
        "final_logit_softcapping": 30.0,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False,
        "enable_moe_block": False,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "torch_dtype": "float32",
    }
    config.update(ids.config_fields())
    config.update(fields)
    config.setdefault("vocab_size_per_layer_input", config["vocab_size"])
    pattern = int(config["sliding_window_pattern"])
    config.setdefault(
        "layer_types",
        [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(int(config["num_hidden_layers"]))
        ],
    )
    return config


# --------------------------------------------------------------------------- minimax

MINIMAX_SPECIAL_TOKENS: tuple[str, ...] = (
    "]~!b[",
    "]~b]",
    "[e~[",
    "<minimax:tool_call>",
    "</minimax:tool_call>",
)
"""The MiniMax-M2 template's markers, added tokens in its own vocabulary."""

MINIMAX_TOKENIZER = TokenizerFamily(
    name="minimax",
    asset_dir="qwen3-tokenizer",
    added_special_tokens=MINIMAX_SPECIAL_TOKENS,
    eos_tokens=("[e~[",),
    bos_token="]~!b[",
    pad_token="<|endoftext|>",
    config_updates={"eos_token": "[e~[", "bos_token": "]~!b["},
)
"""The Qwen3 vocabulary with MiniMax-M2's markers (MiniMax's own is not in the assets)."""

_MINIMAX_SIZES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "tiny": MappingProxyType(
            {
                "hidden_size": 64,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "rotary_dim": 16,
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
            }
        ),
    }
)


def _minimax_config(fields: dict[str, Any], ids: TokenIds) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["MiniMaxM2ForCausalLM"],
        "model_type": "minimax",
        "rms_norm_eps": 1e-6,
        "rope_theta": 5000000.0,
        "max_position_embeddings": 196608,
        "shared_intermediate_size": 0,
        "scoring_func": "sigmoid",
        "use_qk_norm": True,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    config.update(ids.config_fields())
    config.update(fields)
    return config


# --------------------------------------------------------------------------- gpt_oss

_GPT_OSS_SIZES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # a sliding-window and a full-attention layer, 16 routed experts with biases, top-4
        "tiny": MappingProxyType(
            {
                "hidden_size": 64,
                "intermediate_size": 48,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "num_local_experts": 16,
                "num_experts_per_tok": 4,
                "sliding_window": 16,
            }
        ),
    }
)


def _gpt_oss_config(fields: dict[str, Any], ids: TokenIds) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "rms_norm_eps": 1e-5,
        "rope_theta": 150000,
        "rope_scaling": None,
        "max_position_embeddings": 131072,
        "layer_types": ["sliding_attention", "full_attention"],
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    config.update(ids.config_fields())
    config.update(fields)
    return config


def _export_gpt_oss(model: Any, config: dict[str, Any]) -> dict[str, Any]:
    """mlx-lm's own names (experts stacked, as mlx-lm saves gpt-oss), with the biases
    and attention sinks (initialised to zero) given seeded values so they count."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    tensors = dict(tree_flatten(model.parameters()))
    for name, value in tensors.items():
        if name.endswith((".bias", ".sinks")):
            tensors[name] = 0.5 * mx.random.normal(value.shape)
    return tensors


# --------------------------------------------------------------------------- registry

register_model_spec(
    ModelSpec(
        arch="llama",
        tokenizer=QWEN3_TOKENIZER,
        chat_template="Qwen-Qwen2.5-7B-Instruct.jinja",
        sizes=_DENSE_SIZES,
        make_config=_llama_config,
        description="Llama architecture, Qwen3 tokenizer, ChatML template (Hermes JSON tools)",
    )
)
register_model_spec(
    ModelSpec(
        arch="qwen3",
        tokenizer=QWEN3_TOKENIZER,
        chat_template="Qwen-Qwen3-0.6B.jinja",
        sizes=_DENSE_SIZES,
        make_config=_qwen3_config,
        description="Qwen3 dense, Qwen3 tokenizer and template (<think>, Hermes tools)",
    )
)
register_model_spec(
    ModelSpec(
        arch="qwen3_moe",
        tokenizer=QWEN3_TOKENIZER,
        chat_template="Qwen-Qwen3-0.6B.jinja",
        sizes=_QWEN3_MOE_SIZES,
        make_config=_qwen3_moe_config,
        description="Qwen3 MoE (Qwen3-30B-A3B's layers), experts stacked as mlx-lm saves them",
    )
)
register_model_spec(
    ModelSpec(
        arch="qwen3_5",
        tokenizer=QWEN3_TOKENIZER,
        chat_template="Qwen3.5-4B.jinja",
        sizes=QWEN3_5_SIZES,
        make_config=qwen3_5_config,
        export_weights=export_qwen3_5,
        description="Qwen3.5 hybrid GatedDeltaNet/attention + mtp.* head, HF layout",
    )
)
register_model_spec(
    ModelSpec(
        arch="qwen3_5_moe",
        tokenizer=QWEN3_TOKENIZER,
        chat_template="Qwen3.5-4B.jinja",
        sizes=QWEN3_5_MOE_SIZES,
        make_config=qwen3_5_moe_config,
        export_weights=export_qwen3_5_moe,
        description="Qwen3.5 MoE (experts fused as in the checkpoints) + mtp.* head, HF layout",
    )
)
register_model_spec(
    ModelSpec(
        arch="gemma4_text",
        tokenizer=GEMMA4_TOKENIZER,
        chat_template="google-gemma-4-31B-it.jinja",
        sizes=_GEMMA4_SIZES,
        make_config=_gemma4_text_config,
        description="Gemma 4 text, Gemma 3 vocab + Gemma 4 special tokens, Gemma 4 template",
    )
)
register_model_spec(
    ModelSpec(
        arch="minimax",
        tokenizer=MINIMAX_TOKENIZER,
        chat_template="MiniMax-M2.jinja",
        sizes=_MINIMAX_SIZES,
        make_config=_minimax_config,
        description="MiniMax-M2 MoE, Qwen3 vocab + MiniMax markers, MiniMax-M2 template",
    )
)
register_model_spec(
    ModelSpec(
        arch="gpt_oss",
        tokenizer=QWEN3_TOKENIZER,
        chat_template="Qwen-Qwen2.5-7B-Instruct.jinja",
        sizes=_GPT_OSS_SIZES,
        make_config=_gpt_oss_config,
        export_weights=_export_gpt_oss,
        description="gpt-oss MoE (experts with biases, sliding window, sinks), Qwen3 "
        "tokenizer and ChatML template (gpt-oss's own harmony template is not in the assets)",
    )
)
