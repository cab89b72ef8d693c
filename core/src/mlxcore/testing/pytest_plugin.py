"""The ``mlxcore`` pytest plugin: fixtures that hand out small real models.

Registered through the ``pytest11`` entry point, so any project that installs mlxcore
(plugin authors included) gets these fixtures without a ``conftest.py``:

``mlxcore_model_factory``
    session-scoped; :func:`mlxcore.testing.build_test_model` bound to the shared cache
    (``$MLXCORE_TEST_MODELS`` or ``$MLXCORE_HOME/test-models``), so models built in one
    run are reused by the next. Call it as ``factory("qwen3", seed=1, num_hidden_layers=3)``.
``tiny_llama``, ``tiny_qwen3``, ``tiny_qwen3_5``, ``tiny_qwen3_5_moe``, ``tiny_gemma4``,
``tiny_minimax``
    session-scoped paths of the default tiny model of each family.
``mlxcore_server``
    module-scoped factory ``(model, *flags) -> Server`` starting real ``mlxcore serve``
    subprocesses on free ports (see :mod:`mlxcore.testing.server`), stopped when the
    module's tests end; ``mlxcore_session_server`` is the same for servers shared by the
    whole session.

It also registers the ``cpu_wheel`` mark: a test that needs MLX's CPU backend (the
OpenBLAS preload, CPU-only timing facts) says so with ``@pytest.mark.cpu_wheel`` and is
skipped, with the reason, where MLX runs on its CUDA backend.

This module is imported in every pytest run: it must stay cheap (mlx is imported only
when a fixture builds a model).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ModelFactory = Callable[..., Path]
"""``(arch, *, seed=0, size="tiny", **config_overrides) -> Path``."""


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``cpu_wheel`` mark; keep float32 matrix products exact (no TF32) in
    this process and the servers it starts, as ``mlxcore serve`` does."""
    from mlxcore.blas import keep_float32_exact

    keep_float32_exact()
    config.addinivalue_line(
        "markers", "cpu_wheel: needs MLX's CPU backend; skipped where MLX runs on CUDA"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the ``cpu_wheel`` tests where an ``mlx-cuda-*`` wheel is installed."""
    from mlxcore import blas

    if not blas.cuda_backend():
        return
    skip = pytest.mark.skip(reason="needs MLX's CPU wheel; this environment has MLX on CUDA")
    for item in items:
        if item.get_closest_marker("cpu_wheel") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def mlxcore_model_factory() -> ModelFactory:
    """``build_test_model`` bound to the persistent test-model cache."""
    from mlxcore.testing.models import build_test_model, default_test_models_root

    return functools.partial(build_test_model, root=default_test_models_root())


@pytest.fixture(scope="session")
def tiny_llama(mlxcore_model_factory: ModelFactory) -> Path:
    """Tiny Llama model with the Qwen3 tokenizer and the ChatML (Qwen2.5) template."""
    return mlxcore_model_factory("llama")


@pytest.fixture(scope="session")
def tiny_qwen3(mlxcore_model_factory: ModelFactory) -> Path:
    """Tiny Qwen3 model with the Qwen3 tokenizer and template."""
    return mlxcore_model_factory("qwen3")


@pytest.fixture(scope="session")
def tiny_qwen3_5(mlxcore_model_factory: ModelFactory) -> Path:
    """Tiny Qwen3.5 hybrid (GatedDeltaNet + attention) model whose checkpoint has ``mtp.*``."""
    return mlxcore_model_factory("qwen3_5")


@pytest.fixture(scope="session")
def tiny_qwen3_5_moe(mlxcore_model_factory: ModelFactory) -> Path:
    """Tiny Qwen3.5 MoE (experts in every layer and in the ``mtp.*`` head)."""
    return mlxcore_model_factory("qwen3_5_moe")


@pytest.fixture(scope="session")
def tiny_gemma4(mlxcore_model_factory: ModelFactory) -> Path:
    """Tiny Gemma 4 text model with the Gemma 4 special tokens and template."""
    return mlxcore_model_factory("gemma4_text")


@pytest.fixture(scope="session")
def tiny_minimax(mlxcore_model_factory: ModelFactory) -> Path:
    """Tiny MiniMax-M2 MoE model: the Qwen3 vocabulary with MiniMax's markers as special
    tokens, and the MiniMax-M2 template."""
    return mlxcore_model_factory("minimax")


@pytest.fixture(scope="module")
def mlxcore_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Start ``mlxcore serve`` subprocesses: ``mlxcore_server(model, *flags) -> Server``.

    Module-scoped: the servers a test module started stop when it finishes, so a long
    session does not accumulate one live server (hundreds of MB) per module.
    """
    from mlxcore.testing.server import ServerPool

    pool = ServerPool(tmp_path_factory.mktemp("mlxcore-servers"))
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def mlxcore_session_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Like ``mlxcore_server``, for servers shared by the whole session (stopped at its
    end): ``mlxcore_session_server(model, *flags) -> Server``."""
    from mlxcore.testing.server import ServerPool

    pool = ServerPool(tmp_path_factory.mktemp("mlxcore-session-servers"))
    yield pool
    pool.close()
