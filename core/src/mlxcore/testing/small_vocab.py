"""A real byte-level BPE tokenizer with a small vocabulary, cut from the Qwen3 tokenizer.

Test models whose cost must sit in the transformer layers (not in a 151k-row output
projection) need a small vocabulary. :func:`write_small_qwen3_tokenizer` keeps the Qwen3
tokenizer's 256 byte tokens and its first ``merges`` merges, so every text still
tokenizes (byte-level BPE falls back to single bytes), and re-numbers the chat special
tokens (``<|im_start|>``, ``<|im_end|>``, ``<think>``...) right after them. The
pre-tokenizer, normalizer and decoder are the original ones; the result loads with
``transformers`` and ``mlx_lm`` like the full tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlxcore.testing.model_specs import QWEN3_TOKENIZER, TokenIds

BYTE_TOKENS = 256
"""Byte-level BPE keeps one token per byte value; Qwen3 numbers them 0..255."""


def small_qwen3_tokenizer(merges: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``tokenizer.json`` and ``tokenizer_config.json`` contents with ``merges`` merges.

    The vocabulary is ``256 + merges`` regular tokens followed by Qwen3's added tokens
    (26), in their original order.
    """
    from mlxcore.testing.models import asset_text

    if merges < 0:
        raise ValueError("merges must be >= 0")
    data = json.loads(asset_text(QWEN3_TOKENIZER.asset_dir, "tokenizer.json"))
    model = data["model"]
    regular = BYTE_TOKENS + merges
    vocab = {tok: i for tok, i in model["vocab"].items() if i < regular}
    if len(vocab) != regular:
        raise ValueError(f"the Qwen3 vocabulary has no contiguous ids 0..{regular - 1}")
    kept = []
    for merge in model["merges"][:merges]:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        if left not in vocab or right not in vocab or left + right not in vocab:
            raise ValueError(f"merge {merge!r} refers to a token outside the kept vocabulary")
        kept.append([left, right])
    model["vocab"] = vocab
    model["merges"] = kept

    renumbered: dict[int, int] = {}
    for i, added in enumerate(data["added_tokens"]):
        renumbered[int(added["id"])] = regular + i
        added["id"] = regular + i

    config = json.loads(asset_text(QWEN3_TOKENIZER.asset_dir, "tokenizer_config.json"))
    config.pop("chat_template", None)
    config["added_tokens_decoder"] = {
        str(renumbered[int(old)]): entry for old, entry in config["added_tokens_decoder"].items()
    }
    return data, config


def write_small_qwen3_tokenizer(folder: Path, merges: int) -> TokenIds:
    """Write the small tokenizer's two files into ``folder``; return the ids a config needs."""
    from tokenizers import Tokenizer

    data, config = small_qwen3_tokenizer(merges)
    text = json.dumps(data, ensure_ascii=False, indent=2)
    tokenizer = Tokenizer.from_str(text)  # validates the cut before anything is written
    folder = Path(folder)
    (folder / "tokenizer.json").write_text(text, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )

    def token_id(token: str) -> int:
        found = tokenizer.token_to_id(token)
        if found is None:  # pragma: no cover - the Qwen3 added tokens are all kept
            raise ValueError(f"the small tokenizer has no token {token!r}")
        return int(found)

    family = QWEN3_TOKENIZER
    return TokenIds(
        vocab_len=tokenizer.get_vocab_size(with_added_tokens=True),
        eos=tuple(token_id(t) for t in family.eos_tokens),
        bos=token_id(family.bos_token) if family.bos_token else None,
        pad=token_id(family.pad_token) if family.pad_token else None,
    )


__all__ = ["BYTE_TOKENS", "small_qwen3_tokenizer", "write_small_qwen3_tokenizer"]
