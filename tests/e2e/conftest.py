"""Fixtures for the end-to-end tests: real ``mlxcore serve`` subprocesses on free ports.

``mlxcore_server`` is a factory: ``start(model, *flags)`` launches
``python -m mlxcore serve MODEL --port PORT --log-level warning *flags``, waits for
``GET /health`` to answer 200 and returns a :class:`Server`. Servers are stopped with
SIGINT (then SIGKILL) by :meth:`Server.stop`, and any still running when their test
module ends are stopped then (``mlxcore_session_server``'s at the end of the session).

``qwen_server`` is the shared, session-scoped server on ``tiny_qwen3`` with two served
names and an API key; tests that need special flags start their own module-scoped one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mlxcore.testing.server import Server, ServerFactory

API_KEY = "test-key"
MODEL_NAMES = ("tiny-qwen3", "alias-qwen")


@pytest.fixture(scope="session")
def qwen_server(mlxcore_session_server: ServerFactory, tiny_qwen3: Path) -> Server:
    """``tiny_qwen3`` served as ``tiny-qwen3`` and ``alias-qwen``, API key ``test-key``."""
    return mlxcore_session_server(
        tiny_qwen3, "--served-model-name", *MODEL_NAMES, "--api-key", API_KEY
    )


@pytest.fixture
def live_qwen_server(qwen_server: Server) -> Iterator[Server]:
    """``qwen_server``, checked to be still running after the test."""
    yield qwen_server
    assert qwen_server.alive(), f"the server died:\n{qwen_server.log()}"


@pytest.fixture(scope="session")
def scripted_server(mlxcore_session_server: ServerFactory, tiny_qwen3: Path) -> Server:
    """``tiny_qwen3`` served as ``tiny`` (any other name accepted too) with the scripted
    test plugin: a request's ``test_script`` is what the model writes. The tool-call
    grammar is off: scripts write calls in formats other than the model's own (Qwen3-Coder
    XML on a Hermes model) to test the parsers, and the grammar would hold them to JSON."""
    return mlxcore_session_server(
        tiny_qwen3,
        "--served-model-name",
        "tiny",
        "--accept-any-model-name",
        "--plugin",
        "mlxcore.testing.scripted",
        "--tool-call-grammar",
        "off",
    )
