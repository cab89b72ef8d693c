"""mlxcore plugin ``ui``: a page in the browser.

``GET /`` from a browser leads to ``/ui``: a chat playground (model picker, streamed
Markdown answers, reasoning collapsed, tool calls, images for vision models, a stop
button that cancels the request on the server, a parameters panel, conversations kept in
the browser's local storage and exportable as JSON) and a live dashboard (models with
their state and memory, load / unload / pin, engine state, memory, the prefix cache's hit
rate and miss reasons, speculative acceptance, requests and errors per route, recent
requests). The dashboard polls ``/health``, ``/v1/models`` and ``/metrics/json``, the
same sources every other client reads.

Plain ES modules shipped in the wheel: no build step, no CDN, no network fetch. Model
output is rendered as text nodes only (never parsed as HTML) and the page is served with a
Content-Security-Policy that forbids inline scripts and other origins. On by default once
installed; ``--no-ui`` turns it off. See docs/ui.md.
"""

from __future__ import annotations

from typing import Any

import attrs

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.hookspecs import OptionGroup
from mlxcore.settings import add_flags, read_settings, setting


@attrs.frozen
class UISettings:
    """The ui plugin's settings; each default is stated here only."""

    no_ui: bool = setting(
        False, action="store_true",
        help="do not serve the browser page at / and /ui (the API is unchanged)",
    )  # fmt: skip


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """``--no-ui``."""
    add_flags(parser, UISettings)


@hookimpl
def mlxcore_routes(config: ServerConfig) -> list[Any]:
    """The page and its assets, unless ``--no-ui``."""
    if read_settings(config, UISettings).no_ui:
        return []
    from mlxcore_ui.routes import ui_routes

    return ui_routes()
