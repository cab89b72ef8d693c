"""``mlxcore models``: pull from a local stand-in for the Hugging Face Hub (no internet),
resume a killed download, list, quantize to a model ``mlxcore serve`` serves, remove
(refused while a server has the model loaded)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mlxcore.testing import build_test_model
from mlxcore.testing.hub import LocalHub
from mlxcore.testing.server import ServerFactory

pytestmark = pytest.mark.e2e

REPO = "tester/tiny-llama"
STALL_AT = 25_000_000
"""Bytes of the weights (39 MB) sent before the stand-in Hub holds the download
(``huggingface_hub`` writes in 10 MiB chunks: two of them reach the disk)."""


@pytest.fixture(scope="module")
def hub() -> Iterator[LocalHub]:
    served = LocalHub({REPO: build_test_model("llama")})
    yield served
    served.close()


@pytest.fixture(scope="module")
def env(hub: LocalHub, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("models-home")
    return {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(home / "hf"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_OFFLINE": "0",
        "MLXCORE_HOME": str(home / "mlxcore"),
    }


def models(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mlxcore", "models", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_pull_resumes_a_killed_download_and_a_second_pull_is_a_no_op(
    hub: LocalHub, env: dict[str, str]
) -> None:
    hub.stall_after("model.safetensors", STALL_AT)
    cmd = [sys.executable, "-m", "mlxcore", "models", "pull", REPO]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    blobs = Path(env["HF_HOME"]) / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs"
    deadline = time.monotonic() + 120
    partial: list[Path] = []
    while time.monotonic() < deadline:
        partial = [p for p in blobs.glob("*.mlxcore-partial") if p.stat().st_size >= 20 * 2**20]
        if partial:
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    assert partial, "the download never reached the stall"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    hub.release()
    seen = len(hub.requests)
    pulled = models(env, "pull", REPO)
    assert pulled.returncode == 0, pulled.stderr
    assert "downloaded" in pulled.stdout
    assert "model.safetensors:" in pulled.stderr and "%|" in pulled.stderr  # progress bars
    resumed = [rng for path, rng in hub.downloads()[-10:] if path.endswith("model.safetensors")]
    assert resumed and resumed[-1].startswith("bytes=")
    assert int(resumed[-1].removeprefix("bytes=").rstrip("-")) >= 20 * 2**20
    folder = Path(pulled.stdout.rsplit(" at ", 1)[1].strip())
    source = hub.repos[REPO]
    for name in hub.files(REPO):
        assert (folder / name).read_bytes() == (source / name).read_bytes(), name
    assert len(hub.requests) > seen
    seen = len(hub.requests)
    again = models(env, "pull", REPO)
    assert again.returncode == 0 and "already here" in again.stdout
    assert len(hub.requests) == seen  # not one request: the model is whole here
    # `mlxcore serve owner/name` resolves through the same cache: no request either
    code = f"from mlxcore.models.resolve import resolve_model; print(resolve_model({REPO!r}).path)"
    resolved = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    assert resolved.stdout.strip() == str(folder), resolved.stderr
    assert len(hub.requests) == seen
    listed = models(env, "list")
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith(REPO)]
    assert "llama" in row and "core" in row and "MB" in row and "incomplete" not in row
    missing = models(env, "pull", "tester/no-such-repo")
    assert missing.returncode == 1 and "tester/no-such-repo" in missing.stderr


def test_quantize_serve_and_remove(
    env: dict[str, str], mlxcore_server: ServerFactory, hub: LocalHub
) -> None:
    assert models(env, "pull", REPO, "--quiet").returncode == 0
    quantized = models(env, "quantize", REPO, "--bits", "4", "--group-size", "32")
    assert quantized.returncode == 0, quantized.stderr
    name = "tiny-llama-4bit"
    info = models(env, "info", name)
    assert '"quantization": "4-bit g32"' in info.stdout, info.stdout
    folder = Path(env["MLXCORE_HOME"]) / "models" / name
    assert models(env, "quantize", REPO, "--bits", "4", "--group-size", "32").returncode == 1
    server = mlxcore_server(folder, "--served-model-name", "q4")
    answer = httpx.post(f"{server.v1}/chat/completions", timeout=60, json={
        "model": "q4", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
    })  # fmt: skip
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
    refused = models(env, "rm", name, "--server", server.base_url)
    assert refused.returncode == 1 and "loaded" in refused.stderr and folder.is_dir()
    forced = models(env, "rm", name, "--server", server.base_url, "--force")
    assert forced.returncode == 0 and "freed" in forced.stdout and not folder.exists()
    removed = models(env, "rm", REPO)
    assert removed.returncode == 0
    assert REPO not in models(env, "list").stdout
    assert models(env, "rm", REPO).returncode == 1  # gone: a clear error, nothing else
