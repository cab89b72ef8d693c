"""Ollama's ``/api/pull`` and ``/api/delete`` through the ``ollama`` client, against a
server whose Hugging Face endpoint is a local stand-in Hub (no internet): progress
streamed, the pulled model served and listed, a second pull a no-op, delete refused while
loaded and for configured models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest

from mlxcore.testing import build_test_model
from mlxcore.testing.hub import LocalHub
from mlxcore.testing.server import Server, ServerFactory

pytestmark = pytest.mark.e2e

REPO = "tester/tiny-llama"


@pytest.fixture(scope="module")
def hub() -> Iterator[LocalHub]:
    served = LocalHub({REPO: build_test_model("llama")})
    yield served
    served.close()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pull-home")


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, tiny_qwen3: Path, hub: LocalHub, home: Path) -> Server:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_ENDPOINT", hub.url)
        env.setenv("HF_HOME", str(home / "hf"))
        env.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        env.setenv("HF_HUB_OFFLINE", "0")
        return mlxcore_server(tiny_qwen3, "--served-model-name", "tiny")


def test_pull_serves_the_model_and_delete_removes_it(
    server: Server, hub: LocalHub, home: Path
) -> None:
    client = ollama.Client(host=server.base_url, timeout=120)
    steps = list(client.pull(REPO, stream=True))
    assert steps[0].status == "pulling manifest" and steps[-1].status == "success"
    weights = [s for s in steps if s.status == "pulling model.safetensors"]
    assert weights and weights[-1].completed == weights[-1].total and weights[-1].total
    assert REPO in [m.model for m in client.list().models]
    answer = client.chat(model=REPO, messages=[{"role": "user", "content": "hi"}],
                         options={"num_predict": 3, "temperature": 0})  # fmt: skip
    assert answer.done and answer.eval_count == 3
    fetched = len(hub.downloads())
    assert client.pull(REPO).status == "success"  # here already: nothing downloaded
    assert len(hub.downloads()) == fetched
    cached = home / "hf" / "hub" / f"models--{REPO.replace('/', '--')}"
    assert (cached / "refs" / "main").is_file()

    with pytest.raises(ollama.ResponseError) as err:  # loaded: not deleted
        client.delete(REPO)
    assert err.value.status_code == 409
    client.generate(model=REPO, keep_alive=0)  # Ollama's way to unload it
    assert client.delete(REPO).status == "success"
    assert REPO not in [m.model for m in client.list().models]
    assert not cached.exists()  # the files are gone
    with pytest.raises(ollama.ResponseError) as err:
        client.delete(REPO)
    assert err.value.status_code == 404


@pytest.mark.parametrize(
    ("call", "name", "status"),
    [
        ("delete", "tiny", 400),  # not a repo id
        ("delete", "owner/not-here", 404),
        ("pull", "../../etc", 400),
        ("pull", "tester/no-such-repo", 404),
    ],
)
def test_bad_pulls_and_deletes_are_ollama_errors(
    server: Server, call: str, name: str, status: int
) -> None:
    client = ollama.Client(host=server.base_url, timeout=60)
    with pytest.raises(ollama.ResponseError) as err:
        getattr(client, call)(name)
    assert err.value.status_code == status, err.value.error


def test_no_ollama_pull_refuses_pull_and_delete(
    mlxcore_server: ServerFactory, tiny_qwen3: Path
) -> None:
    closed = mlxcore_server(tiny_qwen3, "--no-ollama-pull")
    client = ollama.Client(host=closed.base_url, timeout=60)
    for call in (client.pull, client.delete):
        with pytest.raises(ollama.ResponseError) as err:
            call(REPO)
        assert err.value.status_code == 403 and "--no-ollama-pull" in err.value.error
    assert client.list().models  # the rest of the API is there
