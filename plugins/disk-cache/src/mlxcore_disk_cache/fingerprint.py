"""What binds a stored cache entry to one model: weights, tokenizer, dtype, cache layout.

Entries live in a folder named by this fingerprint, so a different model, a changed
checkpoint, another tokenizer, another dtype or a different cache layout (a quantized
KV cache, a sliding window of another size) never reads an entry written for
something else. Hashing every weight byte of a large checkpoint at each start would
take minutes, so a weight file counts by its name, its size and a hash of its first
and last megabyte (safetensors files begin with a header that lists every tensor's
shape, dtype and offset); small files (config, tokenizer) are hashed whole.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mlx_lm
from mlx.utils import tree_flatten

FORMAT = "mlxcore-disk-cache/2"
"""Bumped when the stored format changes; part of every fingerprint."""

SAMPLE_BYTES = 1 << 20
"""How much of the start and of the end of each weight file is hashed."""

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def _hash_file(digest: Any, path: Path) -> None:
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)


def _hash_sampled(digest: Any, path: Path) -> None:
    size = path.stat().st_size
    digest.update(f"{path.name}:{size}".encode())
    with path.open("rb") as f:
        digest.update(f.read(SAMPLE_BYTES))
        if size > 2 * SAMPLE_BYTES:
            f.seek(size - SAMPLE_BYTES)
            digest.update(f.read(SAMPLE_BYTES))


def layout_of(cache: Iterable[Any]) -> list[str]:
    """The per-layer cache classes and their fixed settings (window size, bits)."""
    out = []
    for layer in cache:
        fixed = {
            k: getattr(layer, k)
            for k in ("max_size", "keep", "bits", "group_size")
            if isinstance(getattr(layer, k, None), int)
        }
        out.append(f"{type(layer).__name__}{json.dumps(fixed, sort_keys=True)}")
    return out


def model_fingerprint(folder: Path, model: Any, layout: list[str]) -> str:
    """A hex digest of the model in ``folder`` as loaded (``model``) with ``layout``."""
    digest = hashlib.sha256(f"{FORMAT}|mlx-lm {mlx_lm.__version__}".encode())
    config = folder / "config.json"
    if config.is_file():
        _hash_file(digest, config)
    for weights in sorted(folder.glob("*.safetensors")):
        _hash_sampled(digest, weights)
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            digest.update(name.encode())
            _hash_file(digest, folder / name)
    params: Any = tree_flatten(model.parameters())
    dtypes = sorted({str(item[1].dtype) for item in params})
    digest.update(json.dumps({"dtypes": dtypes, "layout": layout}).encode())
    return digest.hexdigest()
