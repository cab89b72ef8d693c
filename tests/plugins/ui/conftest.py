"""Fixtures for the web page's tests: a real server and headless Chromium.

Chromium is Debian's (``make setup`` installs it when it runs as root with apt-get, as it
does OpenBLAS); the browser tests are skipped with a message saying so where it is
missing. Playwright for Python drives it (``executable_path``: no browser download).
Screenshots go to ``$MLXCORE_UI_SCREENSHOTS`` when set (``make ui-screenshots`` points it
at docs/images), else to the test's temporary folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlxcore.testing.hub import LocalHub
from mlxcore.testing.server import Server, ServerFactory
from mlxcore_ui.browser import CHROMIUM_ARGS, chromium_path

API_KEY = "ui-test-key"
"""The key ``ui_server`` asks for (the tests spell it out too)."""


USER_KEY = "ui-viewer-key"
"""An ordinary (not admin) key of ``ui_server``: its page shows no admin controls."""


PULLED = "tester/pulled-llama"
"""The repo the stand-in Hub of ``ui_server`` offers (for the page's "Get a model")."""


@pytest.fixture(scope="module")
def ui_hub(tiny_llama: Path) -> Iterator[LocalHub]:
    """A local stand-in for the Hugging Face Hub with one repo, :data:`PULLED`."""
    hub = LocalHub({PULLED: tiny_llama})
    yield hub
    hub.close()


@pytest.fixture(scope="module")
def ui_server(
    mlxcore_server: ServerFactory,
    tiny_qwen3: Path,
    tiny_llama: Path,
    ui_hub: LocalHub,
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    """Two chat models (``qwen``, the default, and ``llama``), both scripted (a request's
    ``test_script`` is what the model writes), behind an admin API key (and an ordinary
    one, :data:`USER_KEY`); its Hugging Face Hub is ``ui_hub`` (and a cache of its own)."""
    folder = tmp_path_factory.mktemp("ui-models")
    keys = folder / "keys.toml"
    keys.write_text(f'[keys.viewer]\nkey = "{USER_KEY}"\n')
    config = folder / "models.toml"
    config.write_text(
        f'[models.llama]\nsource = "{tiny_llama}"\nplugins = ["mlxcore.testing.scripted"]\n'
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_ENDPOINT", ui_hub.url)
        env.setenv("HF_HOME", str(folder / "hf"))
        env.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        env.setenv("HF_HUB_OFFLINE", "0")
        return mlxcore_server(
            tiny_qwen3,
            "--served-model-name",
            "qwen",
            "--plugin",
            "mlxcore.testing.scripted",
            "--models-config",
            str(config),
            "--api-key",
            API_KEY,
            "--api-keys-file",
            str(keys),
        )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (skips the test where there is none)."""
    path = chromium_path()
    if path is None:
        pytest.skip(
            "no Chromium on this machine: `make setup` installs Debian's chromium when it "
            "runs as root with apt-get (or: apt-get install chromium; MLXCORE_CHROMIUM=PATH)"
        )
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where the tests' screenshots go."""
    folder = Path(os.environ.get("MLXCORE_UI_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
