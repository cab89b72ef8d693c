"""``mlxcore models``: pull, list, info, quantize and remove the models on this machine
(see :mod:`mlxcore.models.manager`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mlxcore.models import manager

HELP = "manage local models: pull, list, info, quantize, rm"
DEFAULT_SERVER = "http://127.0.0.1:8000"


def add_models_command(cmd: argparse.ArgumentParser) -> None:
    """The ``models`` subcommand and its actions."""
    actions = cmd.add_subparsers(dest="models_action", metavar="ACTION", required=True)
    pull = actions.add_parser("pull", help="download a Hugging Face repo (resumes; no-op if here)")
    pull.add_argument("repo", help="owner/name (HF_ENDPOINT and HF_TOKEN are honoured)")
    pull.add_argument("--quiet", action="store_true", help="no progress bar")
    listing = actions.add_parser("list", help="the models here: size, quantization, architecture")
    listing.add_argument("--json", action="store_true", help="one JSON object per model")
    info = actions.add_parser("info", help="one model's details")
    info.add_argument("name", help="a name from `mlxcore models list`, or a folder")
    quant = actions.add_parser("quantize", help="write a quantized copy with mlx-lm's converter")
    quant.add_argument("name", help="a name from `mlxcore models list`, or a folder")
    quant.add_argument("--bits", type=int, default=4, choices=manager.BITS)
    quant.add_argument("--group-size", type=int, default=64, choices=manager.GROUP_SIZES)
    quant.add_argument("--recipe", choices=manager.RECIPES, help="a mixed-precision recipe")
    quant.add_argument("--out", default=None, help="the new folder (default under $MLXCORE_HOME)")
    remove = actions.add_parser("rm", help="delete a model's files")
    remove.add_argument("name", help="a name from `mlxcore models list`")
    remove.add_argument("--force", action="store_true", help="even while a server has it loaded")
    remove.add_argument(
        "--server",
        default=DEFAULT_SERVER,
        help=f"the server asked whether the model is loaded (default {DEFAULT_SERVER})",
    )


def run_models(args: argparse.Namespace) -> int:
    """Run one ``mlxcore models`` action; the exit code."""
    from mlxcore.errors import ModelLoadError

    try:
        return ACTIONS[args.models_action](args)
    except (ModelLoadError, ValueError) as exc:
        print(f"mlxcore models: {exc}", file=sys.stderr)
        return 1


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def _row(model: manager.LocalModel) -> dict[str, Any]:
    return {
        "name": model.name,
        "size": model.size,
        "quantization": model.quantization,
        "architecture": model.architecture,
        "served_by": model.served_by,
        "complete": model.complete,
        "where": model.where,
        "path": str(model.path),
    }


def _pull(args: argparse.Namespace) -> int:
    folder, fetched = manager.pull(args.repo, progress=not args.quiet)
    print(f"{args.repo}: {'downloaded' if fetched else 'already here'} at {folder}")
    return 0


def _list(args: argparse.Namespace) -> int:
    models = manager.list_models()
    if args.json:
        for model in models:
            print(json.dumps(_row(model)))
        return 0
    rows = [
        (
            m.name + ("" if m.complete else " (incomplete)"),
            _gb(m.size),
            m.quantization,
            m.architecture,
            ", ".join(m.served_by) or "-",
        )
        for m in models
    ]
    header = ("NAME", "SIZE", "QUANTIZATION", "ARCHITECTURE", "SERVED BY")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _info(args: argparse.Namespace) -> int:
    model = manager.find(args.name)
    print(json.dumps({**_row(model), "config": model.config}, indent=2))
    return 0


def _quantize(args: argparse.Namespace) -> int:
    from pathlib import Path

    source = manager.find(args.name)
    out = Path(args.out).expanduser() if args.out else None
    target = manager.quantize(
        source, out, bits=args.bits, group_size=args.group_size, recipe=args.recipe, report=print
    )
    print(f"wrote {target} ({_gb(manager.find(str(target)).size)}); serve it with "
          f"`mlxcore serve {target}`")  # fmt: skip
    return 0


def loaded_by(server: str, model: manager.LocalModel) -> str | None:
    """The name under which the server at ``server`` has ``model`` loaded (``None``: not
    loaded, or no server answers there)."""
    import httpx

    try:
        entries = httpx.get(f"{server}/v1/models", timeout=3).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    for entry in entries:
        if entry.get("state") != "loaded":
            continue
        if entry.get("root") in (model.name, str(model.path)) or entry.get("id") == model.name:
            return str(entry["id"])
    return None


def _remove(args: argparse.Namespace) -> int:
    model = manager.find(args.name)
    serving = loaded_by(args.server, model)
    if serving is not None and not args.force:
        print(
            f"mlxcore models: {model.name} is loaded by the server at {args.server} (as "
            f"{serving!r}); unload it first, or pass --force",
            file=sys.stderr,
        )
        return 1
    freed = manager.remove(model)
    print(f"removed {model.name}: {_gb(freed)} freed")
    return 0


ACTIONS = {
    "pull": _pull,
    "list": _list,
    "info": _info,
    "quantize": _quantize,
    "rm": _remove,
}
