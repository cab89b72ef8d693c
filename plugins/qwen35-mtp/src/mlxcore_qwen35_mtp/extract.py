"""``mlxcore mtp extract SOURCE_DIR MODEL_DIR``: give a stripped model its MTP head back.

Community-quantized Qwen3.5 models often lost the ``mtp.*`` tensors. This copies them,
unchanged (same dtype, same quantization), from a full checkpoint into
``MODEL_DIR/model-mtp.safetensors``, and records in the file's metadata whether the
source stores its norms as ``w - 1`` (the Hugging Face layout), so the loader converts
them exactly once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcore.models import read_weight_keys
from mlxcore_qwen35_mtp.head import LAYOUT_KEY, SIDECAR, _hf_layout


def extract(source: Path, target: Path) -> tuple[Path, int]:
    """Copy ``source``'s ``mtp.*`` tensors to ``target/model-mtp.safetensors``.

    Returns the written file and the number of tensors. Raises ``ValueError`` when the
    source has no MTP tensors or a folder is missing.
    """
    source, target = Path(source), Path(target)
    for folder in (source, target):
        if not folder.is_dir():
            raise ValueError(f"{folder} is not a directory")
    keys = read_weight_keys(source)
    if not any(k.startswith("mtp.") for k in keys):
        raise ValueError(f"{source} has no mtp.* tensors")
    tensors: dict[str, mx.array] = {}
    hf_layout: bool | None = None
    for file in sorted(source.glob("*.safetensors")):
        loaded: dict[str, Any] = mx.load(str(file))  # type: ignore[assignment]
        if hf_layout is None:
            hf_layout = _hf_layout(loaded)
        tensors.update({k: v for k, v in loaded.items() if k.startswith("mtp.")})
    out = target / SIDECAR
    layout = "hf" if hf_layout or hf_layout is None else "mlx"
    mx.save_safetensors(str(out), tensors, metadata={LAYOUT_KEY: layout})
    return out, len(tensors)


def run(args: argparse.Namespace) -> int:
    """The command handler: 0 on success, 1 with a message on stderr otherwise."""
    if args.mtp_command != "extract":
        print("usage: mlxcore mtp extract SOURCE_DIR MODEL_DIR", file=sys.stderr)
        return 2
    try:
        out, count = extract(Path(args.source), Path(args.model_dir))
    except ValueError as exc:
        print(f"mlxcore mtp extract: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {count} MTP tensors to {out}")
    return 0


def add_commands(subparsers: Any) -> None:
    """Register ``mlxcore mtp extract``."""
    cmd = subparsers.add_parser("mtp", help="Qwen3.5 multi-token-prediction head tools")
    sub = cmd.add_subparsers(dest="mtp_command")
    ext = sub.add_parser(
        "extract", help="copy the mtp.* tensors of a full checkpoint next to a stripped model"
    )
    ext.add_argument("source", metavar="SOURCE_DIR", help="checkpoint that has the head")
    ext.add_argument("model_dir", metavar="MODEL_DIR", help="model that lost it")
    cmd.set_defaults(mlxcore_handler=run, mtp_command=None)
