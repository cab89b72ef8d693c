"""Headless Chromium for the page's tests and benchmark (Debian's package, driven by
Playwright for Python with ``executable_path``: no browser download)."""

from __future__ import annotations

import os
import shutil

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
"""Headless in a container as root, and no connections to the (closed) outside network."""


def chromium_path() -> str | None:
    """Debian's Chromium (``MLXCORE_CHROMIUM`` overrides), or None."""
    for candidate in (os.environ.get("MLXCORE_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None
