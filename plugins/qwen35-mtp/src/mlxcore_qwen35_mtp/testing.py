"""Qwen3.5 test models with a small vocabulary and an MTP head of known quality.

Real Qwen3.5 models spend their time in the transformer layers; the test models of
``mlxcore.testing`` spend it in a 151k-row output projection, which makes speculative
decoding look worse than it is. :func:`build_mtp_model` writes a ``qwen3_5`` checkpoint
(official layout, ``mtp.*`` head included, real Qwen3.5 chat template) whose
vocabulary is a cut of the Qwen3 BPE tokenizer, and whose weights make both the model
and its head predictable:

* every layer's output projection (``o_proj``, ``out_proj``, ``down_proj``) is zero, so
  the residual stream stays the token embedding and the next token depends only on the
  current one. The layers still run in full: they cost what real layers cost.
* the untied ``lm_head`` rows are arranged so that ``argmax(lm_head @ norm(embed[t]))``
  is ``f(t)`` for a random permutation ``f`` of the regular tokens (special tokens and
  EOS are never predicted, so every request runs to ``max_tokens``). ``scale`` sets the
  logit of ``f(t)``: at temperature 1 it decides how peaked the distribution is.
* the MTP head passes the embedding of the next token through ``fc`` (its layer's output
  projections are zero as well), so it predicts ``f(next)``, the model's own next token;
  Gaussian noise on ``fc`` (``noise``) lowers the agreement, and ``agree`` calibrates that
  noise to a target agreement rate. ``head="never"`` negates ``fc``: the head then never
  proposes the model's token (the off-switch check).

``python -m mlxcore_qwen35_mtp.testing OUT --agree 0.8`` writes the benchmark model.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxcore.testing.model_specs import TokenIds
from mlxcore.testing.models import asset_text
from mlxcore.testing.qwen3_5_checkpoint import QWEN3_5_SIZES, export_qwen3_5, qwen3_5_config
from mlxcore.testing.small_vocab import BYTE_TOKENS, write_small_qwen3_tokenizer
from mlxcore_qwen35_mtp.head import _NORM_SUFFIXES, MTPModule

BENCH_SIZE: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 8,
    "full_attention_interval": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "mtp_num_hidden_layers": 1,
}
"""The benchmark shape: 6 GatedDeltaNet + 2 attention layers of hidden size 1024, whose
weights (about 110M float32 parameters) outweigh the 1024-row output projection 100 to 1."""

TINY_SIZE: dict[str, Any] = dict(QWEN3_5_SIZES["tiny"])
"""A shape for fast tests: ``mlxcore.testing``'s tiny ``qwen3_5``."""

_ZEROED = ("o_proj.weight", "out_proj.weight", "down_proj.weight")


def _unit_rows(x: mx.array) -> mx.array:
    return x / mx.linalg.norm(x, axis=-1, keepdims=True)


def head_agreement(embed: mx.array, fc: mx.array, regular: int, perm: mx.array) -> float:
    """Share of regular tokens ``d`` for which the head (``fc`` on the embedding half) proposes
    ``f(d)``, the model's own next token. Exact for the weights this module builds."""
    hidden = embed.shape[-1]
    e = embed[:regular]
    normed = e / mx.sqrt(mx.mean(e * e, axis=-1, keepdims=True) + 1e-6)
    mixed = normed @ fc[:, :hidden].T
    # lm_head row f(t) is unit(e_t): the head's argmax row is the most similar embedding
    scores = _unit_rows(mixed) @ _unit_rows(e).T
    proposed = mx.argmax(scores, axis=-1)  # t such that the head proposes f(t)
    own = mx.arange(regular)  # the model's next token after d is f(d): t == d
    del perm
    rate: float = mx.mean(proposed == own).item()  # type: ignore[assignment]
    return rate


def _fc_weight(hidden: int, noise: float, head: str, key: mx.array) -> mx.array:
    eye = mx.eye(hidden)
    if head == "never":
        embed_half = -eye
    else:
        gauss = mx.random.normal((hidden, hidden), key=key)
        gauss[0, :] = 0.0  # coordinate 0 (the "not a special token" sign) stays clean
        gauss[:, 0] = 0.0
        embed_half = eye + noise * gauss / math.sqrt(hidden)
    return mx.concatenate([embed_half, mx.zeros((hidden, hidden))], axis=1)


def calibrate_noise(embed: mx.array, regular: int, agree: float, seed: int) -> float:
    """The ``fc`` noise level at which the head agrees with the model on ``agree`` of tokens."""
    hidden = embed.shape[-1]
    key = mx.random.key(seed + 1)
    lo, hi = 0.0, 64.0
    for _ in range(24):
        mid = (lo + hi) / 2
        rate = head_agreement(embed, _fc_weight(hidden, mid, "agree", key), regular, mx.array(0))
        if rate > agree:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def build_mtp_model(
    folder: Path,
    *,
    size: dict[str, Any] | None = None,
    merges: int = 742,
    scale: float = 16.0,
    agree: float | None = 0.8,
    noise: float = 0.0,
    head: str = "agree",
    seed: int = 0,
) -> dict[str, Any]:
    """Write the model into ``folder`` (created); return what was built.

    Args:
        size: text-config shape fields (default :data:`BENCH_SIZE`).
        merges: BPE merges kept; the vocabulary is ``256 + merges + 26``.
        scale: the logit of the model's own next token (others are ``scale * cos``
            of random directions).
        agree: calibrate the head's ``fc`` noise to this agreement rate (``None``:
            use ``noise`` as given).
        noise: ``fc`` noise level when ``agree`` is ``None``.
        head: ``"agree"`` (noisy copy of the model's map) or ``"never"`` (negated).
        seed: seeds the weights, the permutation and the noise.
    """
    if head not in ("agree", "never"):
        raise ValueError("head must be 'agree' or 'never'")
    from mlx_lm.models import qwen3_5

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids: TokenIds = write_small_qwen3_tokenizer(folder, merges)
    (folder / "chat_template.jinja").write_text(asset_text("chat-templates", "Qwen3.5-4B.jinja"))
    fields = {**(size or BENCH_SIZE), "vocab_size": ids.vocab_len, "tie_word_embeddings": False}
    config = qwen3_5_config(fields, ids)
    _write_json(folder / "config.json", config)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    _write_json(folder / "generation_config.json", generation)

    mx.random.seed(seed)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(config))
    lm = model.language_model
    hidden = lm.args.hidden_size
    regular = BYTE_TOKENS + merges
    embed = lm.model.embed_tokens.weight
    # coordinate 0 of every embedding is a positive constant: the special-token rows point
    # against it, so special tokens (EOS among them) get a logit of about -30
    embed[:, 0] = 2.0 * mx.std(embed).item()
    lm.model.embed_tokens.weight = embed
    perm = mx.random.permutation(regular, key=mx.random.key(seed + 2))
    rows = mx.zeros((ids.vocab_len, hidden))
    # row f(t) = scale * unit(e_t) / sqrt(H): logit of f(t) after the final norm is `scale`
    rows[perm] = scale * _unit_rows(embed[:regular]) / math.sqrt(hidden)
    normed0 = embed[:, 0] / mx.sqrt(mx.mean(embed * embed, axis=-1))
    rows[regular:, 0] = -30.0 / mx.min(normed0).item()
    lm.lm_head.weight = rows
    params: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    zero_out = [(name, mx.zeros_like(value)) for name, value in params if name.endswith(_ZEROED)]
    model.load_weights(zero_out, strict=False)

    if head == "agree" and agree is not None:
        noise = calibrate_noise(embed, regular, agree, seed)
    fc = _fc_weight(hidden, noise, head, mx.random.key(seed + 1))
    rate = head_agreement(embed, fc, regular, perm)

    module = MTPModule(lm.args, int(fields.get("mtp_num_hidden_layers", 1)))
    module.fc.weight = fc
    head_params: list[tuple[str, mx.array]] = tree_flatten(module.parameters())  # type: ignore[assignment]
    mtp = {
        name: (mx.zeros_like(value) if name.endswith(_ZEROED) else value)
        for name, value in head_params
    }
    tensors = {k: v for k, v in export_qwen3_5(model, config).items() if not k.startswith("mtp.")}
    for name, value in mtp.items():
        if value.ndim == 1 and name.endswith(_NORM_SUFFIXES):
            value = value - 1.0  # the checkpoint stores zero-centred norms
        tensors[f"mtp.{name}"] = value
    tensors = {k: v.astype(mx.float32) for k, v in tensors.items()}
    mx.eval(tensors)
    mx.save_safetensors(str(folder / "model.safetensors"), tensors, metadata={"format": "pt"})
    info = {
        "vocab_size": ids.vocab_len,
        "regular_tokens": regular,
        "head": head,
        "noise": noise,
        "head_agreement": rate,
        "scale": scale,
        "seed": seed,
        "parameters": sum(int(v.size) for v in tensors.values()),
        "size": fields,
    }
    _write_json(folder / "mtp-test-model.json", info)
    return info


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """``python -m mlxcore_qwen35_mtp.testing OUT [--agree 0.8 | --head never] [--tiny]``."""
    parser = argparse.ArgumentParser(prog="python -m mlxcore_qwen35_mtp.testing")
    parser.add_argument("out", type=Path, help="model folder to write")
    parser.add_argument("--agree", type=float, default=0.8, help="head agreement (default 0.8)")
    parser.add_argument("--head", choices=("agree", "never"), default="agree")
    parser.add_argument("--layers", type=int, default=BENCH_SIZE["num_hidden_layers"])
    parser.add_argument("--tiny", action="store_true", help="hidden size 64 (fast tests)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    size = dict(TINY_SIZE if args.tiny else BENCH_SIZE)
    size["num_hidden_layers"] = args.layers if not args.tiny else size["num_hidden_layers"]
    info = build_mtp_model(args.out, size=size, agree=args.agree, head=args.head, seed=args.seed)
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
