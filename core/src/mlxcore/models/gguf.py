"""Convert a llama-family GGUF file (llama, SmolLM2, Qwen2/Qwen3) into an MLX model folder.

Weights come from ``mlx.core.load``, which reads GGUF natively: Q4_0, Q4_1 and Q8_0 tensors
arrive in MLX's affine quantized layout (``weight`` packed in uint32, ``scales`` and
``biases`` per group of 32), other quantizations arrive as float16. Tensor names are mapped
to mlx-lm's names and the Q/K row permutation llama.cpp applies to llama attention is undone.
``config.json`` is written from the GGUF metadata, the tokenizer is rebuilt from the metadata
with transformers' GGUF tokenizer builders. The folder loads with ``mlx_lm.load`` unchanged.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcore.errors import ModelLoadError
from mlxcore.models.gguf_header import check_gguf_file

logger = logging.getLogger(__name__)

#: Storage types: dense float32/float16/bfloat16, or "quantized" (MLX affine quantization
#: with float32 scales/biases: GGUF Q4/Q8 blocks kept as they are, dense matrices at 8 bits).
DTYPES = ("float32", "float16", "bfloat16", "quantized")
#: Float32 decodes fastest on CPU with OpenBLAS preloaded (see the measurements in default.py).
DEFAULT_DTYPE = "float32"

_GROUP_SIZE = 32  # every GGUF block type MLX keeps quantized (Q4_0, Q4_1, Q8_0) has 32 values
_DENSE_BITS = 8  # bits for dense matrices re-quantized in "quantized" mode

# GGUF architecture -> (mlx-lm model_type, HF architectures entry, Q/K rows were permuted)
_ARCHS: dict[str, tuple[str, str, bool]] = {
    "llama": ("llama", "LlamaForCausalLM", True),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", False),
    "qwen3": ("qwen3", "Qwen3ForCausalLM", False),
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_PARTS = ("weight", "scales", "biases", "bias")


def convert_gguf(gguf_path: Path, out_dir: Path, *, dtype: str = DEFAULT_DTYPE) -> Path:
    """Convert ``gguf_path`` into an MLX folder at ``out_dir`` (created if needed).

    Args:
        gguf_path: a GGUF file of the llama family (``general.architecture`` llama, qwen2, qwen3).
        out_dir: the folder to write ``config.json``, ``model.safetensors`` and the tokenizer to.
        dtype: one of :data:`DTYPES`.

    Returns:
        ``out_dir``.

    Raises:
        ModelLoadError: naming ``gguf_path`` when the file is unreadable or unsupported.
    """
    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if dtype not in DTYPES:
        raise ModelLoadError(f"cannot convert {gguf_path}: dtype {dtype!r} is not one of {DTYPES}")
    weights, meta = read_gguf(gguf_path)
    arch = str(meta.get("general.architecture", ""))
    if arch not in _ARCHS:
        raise ModelLoadError(
            f"cannot convert {gguf_path}: GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(sorted(_ARCHS))})"
        )
    config = build_config(meta, weights, gguf_path)
    out_weights, quant = convert_weights(weights, config, gguf_path, dtype=dtype)
    if quant:
        config["quantization"] = quant
    out_dir.mkdir(parents=True, exist_ok=True)
    _save_weights(out_weights, out_dir)
    from mlx_lm.utils import save_config

    save_config(dict(config), out_dir / "config.json")
    save_tokenizer(meta, out_dir, gguf_path)
    source = {"gguf": str(gguf_path.resolve()), "size": gguf_path.stat().st_size, "dtype": dtype}
    (out_dir / "gguf_source.json").write_text(json.dumps(source, indent=2))
    logger.info("converted %s (%s, %s) into %s", gguf_path, arch, dtype, out_dir)
    return out_dir


def read_gguf(gguf_path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Tensors and metadata of a GGUF file; metadata values become plain Python values."""
    check_gguf_file(gguf_path)  # MLX's reader trusts the file: a corrupt one can crash it
    try:
        loaded = mx.load(str(gguf_path), return_metadata=True)
    except (RuntimeError, ValueError, OSError) as exc:
        raise ModelLoadError(f"cannot read GGUF file {gguf_path}: {exc}") from exc
    if not isinstance(loaded, tuple) or not isinstance(loaded[0], dict):
        raise ModelLoadError(f"cannot read GGUF file {gguf_path}: not a GGUF tensor file")
    weights, raw_meta = loaded
    meta = {str(key): _plain(value) for key, value in dict(raw_meta).items()}
    return weights, meta


# GGUF metadata value type -> byte size (8 is a string, 9 an array)
def _f32(value: Any) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-05, not 9.99e-06)."""
    return float(f"{float(value):.7g}")


def _plain(value: Any) -> Any:
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


# --------------------------------------------------------------------------- config


def build_config(
    meta: dict[str, Any], weights: dict[str, mx.array], gguf_path: Path
) -> dict[str, Any]:
    """An HF/mlx-lm ``config.json`` dict from the GGUF metadata (``{arch}.*`` keys)."""
    arch = str(meta["general.architecture"])
    model_type, hf_arch, _ = _ARCHS[arch]

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    try:
        hidden = int(get("embedding_length"))
        heads = int(get("attention.head_count"))
        config: dict[str, Any] = {
            "architectures": [hf_arch],
            "model_type": model_type,
            "hidden_size": hidden,
            "num_hidden_layers": int(get("block_count")),
            "intermediate_size": int(get("feed_forward_length")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(get("attention.head_count_kv", heads)),
            "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon", 1e-6)),
        }
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"cannot convert {gguf_path}: missing {arch}.* metadata") from exc
    head_dim = int(get("attention.key_length", hidden // heads))
    tokens = meta.get("tokenizer.ggml.tokens") or []
    vocab = get("vocab_size") or len(tokens) or weights["token_embd.weight"].shape[0]
    config.update(
        head_dim=head_dim,
        vocab_size=int(vocab),
        max_position_embeddings=int(get("context_length", 4096)),
        rope_theta=_f32(get("rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in weights,
    )
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in weights
        config["mlp_bias"] = False
    rope_dims = get("rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != head_dim:
        raise ModelLoadError(f"cannot convert {gguf_path}: partial rotary embeddings unsupported")
    config["rope_scaling"] = _rope_scaling(meta, arch, weights, config, gguf_path)
    for key in ("bos_token_id", "pad_token_id"):
        if (value := meta.get(f"tokenizer.ggml.{key}")) is not None:
            config[key] = int(value)
    eos = [
        int(v)
        for k in ("eos_token_id", "eot_token_id", "eom_token_id")
        if (v := meta.get(f"tokenizer.ggml.{k}")) is not None
    ]
    eos = list(dict.fromkeys(eos))
    if eos:
        config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return config


def _rope_scaling(
    meta: dict[str, Any],
    arch: str,
    weights: dict[str, mx.array],
    config: dict[str, Any],
    gguf_path: Path,
) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if "rope_freqs.weight" in weights:
        return _fit_llama3_rope(weights["rope_freqs.weight"], config, gguf_path)
    if kind in (None, "none") or not factor:
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float(factor)}
    if kind == "yarn":
        orig = meta.get(f"{arch}.rope.scaling.original_context_length")
        scaling: dict[str, Any] = {"type": "yarn", "factor": float(factor)}
        if orig:
            scaling["original_max_position_embeddings"] = int(orig)
        return scaling
    raise ModelLoadError(f"cannot convert {gguf_path}: rope scaling {kind!r} is not supported")


def _fit_llama3_rope(freqs: mx.array, config: dict[str, Any], gguf_path: Path) -> dict[str, Any]:
    """Recover Llama-3.1-style rope scaling from the per-frequency factors llama.cpp stores."""
    factors = [float(v) for v in freqs.astype(mx.float32).reshape(-1).tolist()]  # type: ignore[union-attr,arg-type]
    dims, base = config["head_dim"], config["rope_theta"]
    factor = max(factors)
    for original in (8192, 4096, 16384, 32768, 131072):
        for low, high in ((1.0, 4.0), (1.0, 2.0), (2.0, 8.0)):
            low_wl, high_wl = original / low, original / high
            ok = True
            for i, got in enumerate(factors):
                wavelen = 2 * math.pi * base ** (2 * i / dims)
                if wavelen < high_wl:
                    want = 1.0
                elif wavelen > low_wl:
                    want = factor
                else:
                    smooth = (original / wavelen - low) / (high - low)
                    want = 1 / ((1 - smooth) / factor + smooth)
                if abs(want - got) > 1e-3 * want:
                    ok = False
                    break
            if ok:
                return {
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": original,
                }
    raise ModelLoadError(f"cannot convert {gguf_path}: unrecognised rope_freqs scaling")


# --------------------------------------------------------------------------- weights


def mlx_name(gguf_name: str) -> str | None:
    """The mlx-lm parameter prefix for a GGUF tensor base name (``blk.3.attn_q``), or None."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}"
    return None


def unpermute_rows(x: mx.array, n_head: int) -> mx.array:
    """Undo llama.cpp's Q/K permutation (rows ``(head, 2, half)`` stored as ``(head, half, 2)``)."""
    rows = x.shape[0]
    shaped = x.reshape(n_head, rows // n_head // 2, 2, *x.shape[1:])
    return shaped.swapaxes(1, 2).reshape(x.shape)


def convert_weights(
    weights: dict[str, mx.array],
    config: dict[str, Any],
    gguf_path: Path,
    *,
    dtype: str = DEFAULT_DTYPE,
) -> tuple[dict[str, mx.array], dict[str, Any] | None]:
    """GGUF tensors -> mlx-lm tensors in ``dtype``; also the ``quantization`` config, if any."""
    groups: dict[str, dict[str, mx.array]] = {}
    for name, array in weights.items():
        base, _, part = name.rpartition(".")
        if part not in _PARTS:
            base, part = name, "weight"
        groups.setdefault(base, {})[part] = array
    permuted = any(t == config["model_type"] and perm for t, _, perm in _ARCHS.values())
    out: dict[str, mx.array] = {}
    layer_bits: dict[str, int] = {}
    for base, parts in groups.items():
        if base == "rope_freqs":
            continue  # folded into config["rope_scaling"]
        target = mlx_name(base)
        if target is None or "weight" not in parts:
            raise ModelLoadError(f"cannot convert {gguf_path}: unsupported tensor {base!r}")
        if permuted and base.endswith((".attn_q", ".attn_k")):
            heads = config["num_attention_heads" if base.endswith("q") else "num_key_value_heads"]
            parts = {k: unpermute_rows(v, heads) for k, v in parts.items()}
        bits = _convert_one(target, parts, dtype, out)
        if bits:
            layer_bits[target] = bits
    if not layer_bits:
        return out, None
    default_bits = max(set(layer_bits.values()), key=list(layer_bits.values()).count)
    quant: dict[str, Any] = {"group_size": _GROUP_SIZE, "bits": default_bits, "mode": "affine"}
    for target, bits in layer_bits.items():
        if bits != default_bits:
            quant[target] = {"group_size": _GROUP_SIZE, "bits": bits, "mode": "affine"}
    return out, quant


def _convert_one(
    target: str, parts: dict[str, mx.array], dtype: str, out: dict[str, mx.array]
) -> int:
    """Write ``target``'s tensors into ``out``; return the bits when stored quantized, else 0."""
    float_type = {"float16": mx.float16, "bfloat16": mx.bfloat16}.get(dtype, mx.float32)
    weight = parts["weight"]
    if "bias" in parts:
        out[f"{target}.bias"] = parts["bias"].astype(float_type)
    if "scales" in parts:
        scales, biases = parts["scales"], parts.get("biases")
        bits = weight.shape[-1] * 32 // (scales.shape[-1] * _GROUP_SIZE)
        if dtype == "quantized":
            out[f"{target}.weight"] = weight
            out[f"{target}.scales"] = scales.astype(mx.float32)
            if biases is not None:
                out[f"{target}.biases"] = biases.astype(mx.float32)
            return int(bits)
        dense = mx.dequantize(
            weight,
            scales.astype(mx.float32),
            None if biases is None else biases.astype(mx.float32),
            group_size=_GROUP_SIZE,
            bits=int(bits),
        )
        out[f"{target}.weight"] = dense.astype(float_type)
        return 0
    is_matrix = weight.ndim == 2 and weight.shape[-1] % _GROUP_SIZE == 0
    if dtype == "quantized" and is_matrix and not target.endswith("norm"):
        q, s, b = mx.quantize(weight.astype(mx.float32), group_size=_GROUP_SIZE, bits=_DENSE_BITS)
        out[f"{target}.weight"], out[f"{target}.scales"], out[f"{target}.biases"] = q, s, b
        return _DENSE_BITS
    out[f"{target}.weight"] = weight.astype(float_type)
    return 0


def _save_weights(weights: dict[str, mx.array], out_dir: Path) -> None:
    from mlx_lm.utils import make_shards

    shards = make_shards(weights)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map: dict[str, str] = {}
    for name, shard in zip(names, shards, strict=True):
        mx.save_safetensors(str(out_dir / name), shard, metadata={"format": "mlx"})
        weight_map.update(dict.fromkeys(shard, name))
    index = {
        "metadata": {"total_size": sum(v.nbytes for v in weights.values())},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


# --------------------------------------------------------------------------- tokenizer


def save_tokenizer(meta: dict[str, Any], out_dir: Path, gguf_path: Path) -> None:
    """Build a fast tokenizer from the GGUF metadata and ``save_pretrained`` it into ``out_dir``.

    Uses transformers' GGUF tokenizer builders; the chat template comes from
    ``tokenizer.chat_template`` and is saved where mlx-lm's loader finds it.
    """
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    tokenizer_dict = {
        name: meta[f"tokenizer.{key}"]
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in meta
    }
    kwargs: dict[str, Any] = {
        name: meta[f"tokenizer.{key}"]
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer_config"].items()
        if f"tokenizer.{key}" in meta
    }
    tokens = tokenizer_dict.get("tokens")
    if not tokens:
        raise ModelLoadError(f"cannot convert {gguf_path}: no tokenizer in its metadata")
    if tokenizer_dict.get("tokenizer_type") == "llama":
        kwargs.setdefault("add_bos_token", True)  # llama.cpp's default for sentencepiece
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        token_id = meta.get(f"tokenizer.ggml.{key}")
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            kwargs[name] = tokens[int(token_id)]
    try:
        backend, extra = convert_gguf_tokenizer(str(meta["general.architecture"]), tokenizer_dict)
    except (ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot build the tokenizer of {gguf_path}: {exc}") from exc
    if tokenizer_dict.get("pre_tokenizer_type") == "smollm":
        # llama.cpp's "smollm" split: every digit alone, then the GPT-2 byte-level regex.
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs, **extra)
    tokenizer.save_pretrained(str(out_dir))
