"""Shared by the audio plugin's server tests."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from mlxcore.testing.server import Server, ServerFactory


@pytest.fixture(scope="module")
def serve_beside_chat(
    mlxcore_server: ServerFactory, tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Server]:
    """``serve(name, folder, task, *flags)``: a server with the chat model ``chat`` and
    ``folder`` served as ``name`` for ``task`` (through a models file)."""

    def serve(name: str, folder: Path, task: str, *flags: str) -> Server:
        config = tmp_path_factory.mktemp(name) / "models.toml"
        config.write_text(f'[models.{name}]\nsource = "{folder}"\ntask = "{task}"\n')
        return mlxcore_server(
            tiny_llama, "--served-model-name", "chat", "--models-config", str(config), *flags
        )

    return serve


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    """OpenAI's client on the module's ``server`` (no retries: a refusal shows)."""
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def beside_chats() -> Callable[[openai.OpenAI, Callable[[int], Any], int], list[Any]]:
    """:func:`run_beside_chats`."""
    return run_beside_chats


def run_beside_chats(client: openai.OpenAI, work: Callable[[int], Any], count: int) -> list[Any]:
    """``count`` calls of ``work`` while eight chats run on the model ``chat``: their
    results, once every chat finished normally (none starved, none failed)."""

    def chat(i: int) -> str | None:
        reply = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": f"count to {i}"}], max_tokens=24
        )
        return reply.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(count + 8) as pool:
        results = pool.map(work, range(count))
        reasons = pool.map(chat, range(8))
        out = list(results)
        assert all(r in ("stop", "length") for r in reasons)
    return out
