"""The names models are served under."""

from __future__ import annotations

from pathlib import Path


def model_name(source: str) -> str:
    """The name a model is served under by default: a Hub repo id as given, a folder's
    or a GGUF file's own name (never a local path)."""
    path = Path(source)
    if path.is_absolute() or source.startswith((".", "~")) or path.exists():
        return path.stem if path.suffix == ".gguf" else path.name or source
    return source
