"""The ollama plugin's one setting."""

from __future__ import annotations

import attrs

from mlxcore.settings import setting


@attrs.frozen
class OllamaSettings:
    """Each default is stated here only."""

    no_ollama_pull: bool = setting(
        False, action="store_true",
        help="refuse Ollama's /api/pull and /api/delete (downloading and deleting models "
        "on this machine; with them on, anyone holding an API key may)",
    )  # fmt: skip
