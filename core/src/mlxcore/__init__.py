"""mlxcore: an OpenAI-compatible inference server for MLX models, built from plugins.

Plugins implement hooks declared in :mod:`mlxcore.hookspecs` and mark their
implementations with :data:`hookimpl`::

    from mlxcore import hookimpl

    @hookimpl
    def mlxcore_tool_parsers():
        return [MyParser]
"""

from __future__ import annotations

import pluggy

__version__ = "0.1.0"

PROJECT_NAME = "mlxcore"
"""The pluggy project name and the entry-point group plugins register under."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

__all__ = ["PROJECT_NAME", "__version__", "hookimpl", "hookspec"]
