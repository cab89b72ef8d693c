"""``mlxcore serve`` with no model serves the embedded default under its human name, and
neither its responses nor its info-level log show the local cache path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mlxcore.models.default import DEFAULT_MODEL_NAME, ensure_default_model
from mlxcore.testing.server import Server, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_default_model_is_named_not_pathed(tmp_path: Path) -> None:
    folder = ensure_default_model()
    port = free_port()
    log_path = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "mlxcore", "serve", "--port", str(port), "--log-level", "info"]
    with log_path.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    server = Server(proc, port, log_path)
    try:
        server.wait_ready()
        models = httpx.get(f"{server.v1}/models", timeout=30).json()["data"]
        assert [m["id"] for m in models] == [DEFAULT_MODEL_NAME]
        reply = httpx.post(
            f"{server.v1}/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            timeout=120,
        )
        assert reply.json()["model"] == DEFAULT_MODEL_NAME
        health = httpx.get(f"{server.base_url}/health", timeout=30).text
        for text in (str(models), reply.text, health):
            assert str(folder) not in text and str(Path.home()) not in text
    finally:
        server.stop()
    log = server.log()
    assert "serving SmolLM2-135M-Instruct" in log
    assert str(folder.parent) not in log and str(Path.home()) not in log, log
