"""The small ``qwen3`` test model (hidden 512, 4 layers, float32) with a smaller
vocabulary: the Qwen3 tokenizer cut to ``--vocab`` tokens (its byte tokens, the first
merges, the chat special tokens; ``mlxcore.testing.small_vocab``), seeded weights. For
benchmarks on a 32K-vocabulary model (issue 37), where the output projection no longer
dominates a step.

    .venv/bin/python scripts/vocab_model.py [--vocab 32000] [--seed 0] [--shape 100m] OUT

``--shape 100m``: 12 layers of hidden 768 (~100M parameters with the 32K vocabulary).

Prints the folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxcore.testing import build_test_model
from mlxcore.testing.models import asset_text
from mlxcore.testing.small_vocab import BYTE_TOKENS, write_small_qwen3_tokenizer

ADDED_TOKENS = 26
"""Qwen3's added (special) tokens, kept after the regular ones."""


SHAPES: dict[str, dict[str, int]] = {
    "small": {},
    # ~100M parameters with the 32K vocabulary (12.8 GFLOP per 64-row step): issue 58
    "100m": {
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
    },
}
"""``--shape``: fields over the small qwen3's config."""


def build(folder: Path, vocab: int, seed: int, shape: str = "small") -> Path:
    from mlx_lm.models import qwen3

    folder.mkdir(parents=True, exist_ok=True)
    ids = write_small_qwen3_tokenizer(folder, vocab - BYTE_TOKENS - ADDED_TOKENS)
    (folder / "chat_template.jinja").write_text(
        asset_text("chat-templates", "Qwen-Qwen3-0.6B.jinja")
    )
    small = json.loads((build_test_model("qwen3", size="small") / "config.json").read_text())
    config: dict[str, Any] = {
        **small,
        **SHAPES[shape],
        **ids.config_fields(),
        "vocab_size": ids.vocab_len,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    mx.random.seed(seed)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    params: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    tensors = {name: value.astype(mx.float32) for name, value in params}
    mx.save_safetensors(str(folder / "model.safetensors"), tensors, metadata={"format": "pt"})
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    args = parser.parse_args()
    print(build(args.out, args.vocab, args.seed, args.shape))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
