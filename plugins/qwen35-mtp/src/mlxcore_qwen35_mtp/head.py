"""The Qwen3.5 multi-token-prediction head: built on mlx-lm's layers, loaded from the checkpoint.

A Qwen3.5 checkpoint carries ``mtp.*`` tensors that mlx-lm's loader drops: ``fc`` mixes
the normed embedding of the next token with the normed last hidden state of the main
model, one (or more) full-attention decoder layers of the main model's own kind run over
the result, and a final norm gives a hidden state that the main model's output head turns
into logits for the token after next. This module rebuilds that head on
``mlx_lm.models.qwen3_5.DecoderLayer``, loads its tensors (from the checkpoint itself or a
``model-mtp.safetensors`` sidecar), and shares the model's embedding and output head
(references, never copies).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from mlxcore.model_info import ModelInfo
from mlxcore.models import ModelLoadError
from mlxcore.speculative.verify import RecurrentStates, forward_verify

log = logging.getLogger(__name__)

SIDECAR = "model-mtp.safetensors"
"""The file name of a head stored next to a model that lost its own (``mlxcore mtp extract``)."""

LAYOUT_KEY = "mlxcore_mtp_layout"
"""Sidecar metadata: ``"hf"`` when the norms use the checkpoint convention ``w - 1``."""

SUPPORTED_TYPES = frozenset({"qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"})

_NORM_SUFFIXES = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "q_norm.weight",
    "k_norm.weight",
    "norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)


class MTPModule(nn.Module):
    """``fc`` over [norm(embedding); norm(hidden)], decoder layer(s), final norm."""

    def __init__(self, args: Any, depth: int) -> None:
        super().__init__()
        from mlx_lm.models import qwen3_5

        hidden = args.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        full_attention = args.full_attention_interval - 1
        self.layers = [qwen3_5.DecoderLayer(args, layer_idx=full_attention) for _ in range(depth)]
        for layer in self.layers:
            if layer.is_linear:  # pragma: no cover - guards a change of mlx-lm's layer rule
                raise ModelLoadError("the MTP decoder layer must be a full-attention layer")
        self.norm = nn.RMSNorm(hidden, eps=args.rms_norm_eps)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list[Any]) -> mx.array:
        """Hidden states (B, T, H) for T (next-token embedding, main hidden state) pairs."""
        h = mx.concatenate(
            [self.pre_fc_norm_embedding(embeddings), self.pre_fc_norm_hidden(hidden)], axis=-1
        )
        h = self.fc(h)
        mask = create_attention_mask(h, cache[0])
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            h = layer(h, mask=mask, cache=layer_cache)
        return self.norm(h)


class MTPHead:
    """An MTP module bound to one model instance's embedding, trunk and output head.

    Not an ``nn.Module``: holding the base model's embedding here must not make its
    parameters appear twice anywhere.

    Attributes:
        module: the MTP layers (own weights).
        trunk: the main model's text trunk (``inputs, cache -> final-normed hidden``).
        embed: the main model's token embedding (shared).
        project: hidden -> logits, the main model's output head (shared).
        source: where the weights came from (for logs and docs).
    """

    def __init__(self, model: Any, module: MTPModule, source: str) -> None:
        lm = getattr(model, "language_model", model)
        self.module = module
        self.trunk = lm.model
        self.embed = lm.model.embed_tokens
        tied = getattr(lm.args, "tie_word_embeddings", False)
        self.project = lm.model.embed_tokens.as_linear if tied else lm.lm_head
        self.source = source

    def make_cache(self) -> list[KVCache]:
        """A fresh KV cache for the MTP layers of one sequence."""
        return [KVCache() for _ in self.module.layers]

    def forward_main(self, tokens: mx.array, cache: list[Any]) -> tuple[mx.array, mx.array]:
        """Run the main model on ``tokens`` (B, T): (hidden (B, T, H), logits (B, T, V))."""
        hidden = self.trunk(tokens, cache)
        return hidden, self.project(hidden)

    def verify(
        self, tokens: mx.array, cache: list[Any]
    ) -> tuple[mx.array, mx.array, list[RecurrentStates | None]]:
        """Run the main model on ``tokens`` (B, T), keeping per-position recurrent states.

        Returns hidden states (B, T, H), logits (B, T, V) and, per layer, the states that
        :func:`~mlxcore.speculative.verify.rollback` selects from.
        """
        hidden, recurrent = forward_verify(self.trunk, tokens, cache)
        return hidden, self.project(hidden), recurrent

    def draft(
        self,
        tokens: mx.array,
        hidden: mx.array,
        cache: list[Any],
        last: mx.array | None = None,
    ) -> tuple[mx.array, mx.array]:
        """Run the head over (tokens (B, T), main hidden (B, T, H)).

        Returns its hidden state at position ``last[b]`` of each row (the last position
        when ``None``), (B, 1, H), and the logits there (B, 1, V): only that position
        drafts, so only it pays the vocabulary projection.
        """
        h = self.module(self.embed(tokens), hidden, cache)
        h = h[:, -1:] if last is None else mx.take_along_axis(h, last[:, None, None], axis=1)
        return h, self.project(h)


def checkpoint_files(path: Path) -> list[Path]:
    """The model folder's safetensors files, the sidecar last."""
    files = sorted(p for p in Path(path).glob("*.safetensors") if p.name != SIDECAR)
    sidecar = Path(path) / SIDECAR
    return [*files, sidecar] if sidecar.exists() else files


def has_mtp_weights(info: ModelInfo) -> bool:
    """True when the checkpoint (or a sidecar next to it) carries ``mtp.*`` tensors."""
    if any(k.startswith("mtp.") for k in info.weight_keys):
        return True
    return (Path(info.path) / SIDECAR).exists()


def _hf_layout(weights: dict[str, mx.array]) -> bool | None:
    """mlx-lm's rule: PyTorch conv1d layout means the norms are stored as ``w - 1``."""
    for key, value in weights.items():
        if key.endswith("conv1d.weight"):
            return bool(value.shape[-1] != 1)
    return None


def read_mtp_tensors(path: Path) -> tuple[dict[str, mx.array], bool, str]:
    """The ``mtp.*`` tensors (prefix stripped), whether their norms are ``w - 1``, and the file.

    The checkpoint's own tensors win over the sidecar's.
    """
    found: dict[str, mx.array] = {}
    hf_layout: bool | None = None
    source = ""
    for file in checkpoint_files(path):
        result: Any = mx.load(str(file), return_metadata=True)
        loaded: dict[str, mx.array] = result[0]
        metadata: dict[str, str] = result[1]
        if file.name == SIDECAR:
            if found:
                break
            layout = metadata.get(LAYOUT_KEY, "hf")
            return (
                {k.removeprefix("mtp."): v for k, v in loaded.items() if k.startswith("mtp.")},
                layout == "hf",
                str(file),
            )
        mtp = {k.removeprefix("mtp."): v for k, v in loaded.items() if k.startswith("mtp.")}
        if hf_layout is None:
            hf_layout = _hf_layout(loaded)
        if mtp:
            found.update(mtp)
            source = str(file)
    return found, bool(hf_layout), source


def convert(weights: dict[str, mx.array], hf_layout: bool) -> dict[str, mx.array]:
    """Checkpoint layout -> the module's: norms ``w - 1`` -> ``w`` (as mlx-lm's sanitize does
    for the main model), fused MoE expert tensors -> mlx-lm's ``switch_mlp``."""
    out: dict[str, mx.array] = {}
    for key, value in weights.items():
        if key.endswith("mlp.experts.gate_up_proj"):
            prefix = key.removesuffix("experts.gate_up_proj")
            mid = value.shape[-2] // 2
            out[f"{prefix}switch_mlp.gate_proj.weight"] = value[..., :mid, :]
            out[f"{prefix}switch_mlp.up_proj.weight"] = value[..., mid:, :]
            continue
        if key.endswith("mlp.experts.down_proj"):
            out[key.removesuffix("experts.down_proj") + "switch_mlp.down_proj.weight"] = value
            continue
        if hf_layout and value.ndim == 1 and key.endswith(_NORM_SUFFIXES):
            value = value + 1.0
        out[key] = value
    return out


def _quantize_like(module: MTPModule, weights: dict[str, mx.array]) -> None:
    """Quantize exactly the layers shipped quantized, with the bits and group size shipped."""

    def predicate(path: str, layer: nn.Module) -> bool | dict[str, int]:
        scales = weights.get(f"{path}.scales")
        if scales is None or not hasattr(layer, "to_quantized"):
            return False
        in_features = layer.weight.shape[-1]
        bits = weights[f"{path}.weight"].shape[-1] * 32 // in_features
        return {"group_size": in_features // scales.shape[-1], "bits": bits}

    nn.quantize(module, class_predicate=predicate)


def build_head(model: Any, info: ModelInfo) -> MTPHead:
    """Build and load the MTP head for ``model``; raise ``ModelLoadError`` when impossible."""
    lm = getattr(model, "language_model", model)
    args = getattr(lm, "args", None)
    if args is None or not hasattr(lm, "model") or not hasattr(args, "full_attention_interval"):
        raise ModelLoadError(f"{type(model).__name__} is not a Qwen3.5 model mlx-lm built")
    raw, hf_layout, source = read_mtp_tensors(Path(info.path))
    if not raw:
        raise ModelLoadError(f"no mtp.* tensors in {info.path} (nor {SIDECAR})")
    weights = convert(raw, hf_layout)
    depth = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("layers."))
    module = MTPModule(args, depth)
    _quantize_like(module, weights)
    flat: list[tuple[str, Any]] = tree_flatten(module.parameters())  # type: ignore[assignment]
    expected = {k for k, _ in flat}
    missing = sorted(expected - weights.keys())
    extra = sorted(weights.keys() - expected)
    if missing or extra:
        raise ModelLoadError(
            f"MTP weights in {source} do not fit the head: missing {missing[:5]}, "
            f"unexpected {extra[:5]}"
        )
    module.load_weights(list(weights.items()))
    module.eval()
    mx.eval(module.parameters())
    log.info("MTP head loaded from %s (%d layer(s), norms w-1: %s)", source, depth, hf_layout)
    return MTPHead(model, module, source)
