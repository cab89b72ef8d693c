"""A target and a draft model of known agreement, for benchmarks and tests.

Like the MTP plugin's benchmark model (``mlxcore_qwen35_mtp.testing``): ``qwen3``
checkpoints with a small cut of the Qwen3 tokenizer, whose layers run in full but whose
output projections (``o_proj``, ``down_proj``) are zero, so the next token depends on
the current one only: ``argmax(lm_head @ norm(embed[t]))``. The target's ``lm_head``
maps ``t`` to ``f(t)`` for a random permutation ``f`` of the regular tokens; the draft
shares the embeddings and maps ``t`` to ``f(s(t))``, where ``s`` moves a chosen share of
the tokens around a cycle and leaves the rest in place, so the draft proposes the
target's token for exactly the ``agree`` share of tokens (``agree=0``: never).
Special tokens are never predicted, so every request runs to ``max_tokens``.

The target is layer-dominated (8 layers of hidden size 1024 beside a ~1,000-row output
projection); the draft has one such layer.

``python -m mlxcore_draft.testing OUT [--agree 0.8]`` writes ``OUT/target`` and
``OUT/draft``.
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
from mlxcore.testing.small_vocab import BYTE_TOKENS, write_small_qwen3_tokenizer

BENCH_SHAPE: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
}
"""Per-layer shape of both models (~25M float32 parameters per layer)."""

_ZEROED = ("o_proj.weight", "down_proj.weight")


def _unit_rows(x: mx.array) -> mx.array:
    return x / mx.linalg.norm(x, axis=-1, keepdims=True)


def agreeing_map(regular: int, agree: float, key: mx.array) -> mx.array:
    """``s``: a permutation of ``range(regular)`` that fixes the ``agree`` share of tokens
    and moves every other one (one cycle through the moved tokens)."""
    order: list[int] = mx.random.permutation(regular, key=key).tolist()  # type: ignore[assignment]
    moved = order[: round((1.0 - agree) * regular)]
    s = list(range(regular))
    if len(moved) > 1:
        for a, b in zip(moved, moved[1:] + moved[:1], strict=True):
            s[a] = b
    return mx.array(s)


def _write(
    folder: Path, layers: int, merges: int, lm_rows: mx.array, embed: mx.array, seed: int
) -> tuple[TokenIds, int]:
    from mlx_lm.models import qwen3

    folder.mkdir(parents=True, exist_ok=True)
    ids = write_small_qwen3_tokenizer(folder, merges)
    template = asset_text("chat-templates", "Qwen-Qwen3-0.6B.jinja")
    (folder / "chat_template.jinja").write_text(template)
    config: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        **ids.config_fields(),
        **BENCH_SHAPE,
        "num_hidden_layers": layers,
        "vocab_size": ids.vocab_len,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    mx.random.seed(seed)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    model.model.embed_tokens.weight = embed
    model.lm_head.weight = lm_rows
    params: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    tensors = {
        name: (mx.zeros_like(v) if name.endswith(_ZEROED) else v).astype(mx.float32)
        for name, v in params
    }
    mx.eval(tensors)
    mx.save_safetensors(str(folder / "model.safetensors"), tensors, metadata={"format": "pt"})
    return ids, sum(int(v.size) for v in tensors.values())


def build_draft_pair(
    root: Path,
    *,
    agree: float = 0.8,
    target_layers: int = 8,
    draft_layers: int = 1,
    merges: int = 742,
    scale: float = 16.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Write ``root/target`` and ``root/draft``; return what was built.

    Args:
        agree: the share of tokens for which the draft proposes the target's next token.
        scale: the logit of a model's own next token (others: ``scale * cos`` of random
            directions); at temperature 1 it sets how peaked the distributions are.
    """
    if not 0.0 <= agree <= 1.0:
        raise ValueError("agree must be within [0, 1]")
    root = Path(root)
    regular = BYTE_TOKENS + merges
    vocab = regular + 26  # Qwen3's added tokens follow the regular ones
    hidden = BENCH_SHAPE["hidden_size"]
    embed = mx.random.normal((vocab, hidden), key=mx.random.key(seed))
    # coordinate 0 is a positive constant: special-token rows point against it (logit ~ -30)
    embed[:, 0] = 2.0 * mx.std(embed).item()
    f = mx.random.permutation(regular, key=mx.random.key(seed + 2))
    s = agreeing_map(regular, agree, mx.random.key(seed + 3))
    normed0 = embed[:, 0] / mx.sqrt(mx.mean(embed * embed, axis=-1))
    special = -30.0 / mx.min(normed0).item()

    def lm_head(next_of: mx.array) -> mx.array:
        # row next_of[t] = scale * unit(e_t) / sqrt(H): after the final norm, the logit of
        # next_of[t] given t is `scale`
        rows = mx.zeros((vocab, hidden))
        rows[next_of] = scale * _unit_rows(embed[:regular]) / math.sqrt(hidden)
        rows[regular:, 0] = special
        return rows

    ids, target_params = _write(root / "target", target_layers, merges, lm_head(f), embed, seed)
    _, draft_params = _write(root / "draft", draft_layers, merges, lm_head(f[s]), embed, seed + 1)
    measured: float = mx.mean(f[s] == f).item()  # type: ignore[assignment]
    info = {
        "vocab_size": ids.vocab_len,
        "regular_tokens": regular,
        "agreement": round(measured, 4),
        "target_layers": target_layers,
        "draft_layers": draft_layers,
        "target_parameters": target_params,
        "draft_parameters": draft_params,
        "scale": scale,
        "seed": seed,
    }
    (root / "draft-pair.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv: list[str] | None = None) -> int:
    """``python -m mlxcore_draft.testing OUT [--agree 0.8] [--target-layers 8]``."""
    parser = argparse.ArgumentParser(prog="python -m mlxcore_draft.testing")
    parser.add_argument("out", type=Path, help="folder for target/ and draft/")
    parser.add_argument("--agree", type=float, default=0.8)
    parser.add_argument("--target-layers", type=int, default=8)
    parser.add_argument("--draft-layers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    info = build_draft_pair(
        args.out,
        agree=args.agree,
        target_layers=args.target_layers,
        draft_layers=args.draft_layers,
        seed=args.seed,
    )
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
