"""Fixtures for the vision plugin tests: a tiny real Qwen2-VL, images made with PIL, a
real ``mlxcore serve`` on it, and ``mlx_vlm.generate`` as the reference."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vision_helpers import Reference

from mlxcore.testing.server import Server, ServerFactory
from mlxcore_vision.testing import build_test_vlm

MAX_IMAGE_PIXELS = 40_000


@pytest.fixture(scope="session")
def tiny_qwen2_vl() -> Path:
    """A tiny Qwen2-VL (real mlx-vlm architecture, seeded weights, Qwen tokenizer)."""
    return build_test_vlm("qwen2_vl", seed=0)


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the server allows local image paths under."""
    return tmp_path_factory.mktemp("vision-media")


def start_like_reference(mlxcore_server: ServerFactory, model: Path, *flags: str) -> Server:
    """Start a server with the BLAS this test process uses (the reference BLAS: the server
    would otherwise preload OpenBLAS, whose float32 rounding differs, and a tiny random
    model's near-tied logits would then compare two numerics libraries, not two code
    paths)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLXCORE_NO_OPENBLAS", "1")
        return mlxcore_server(model, *flags)


@pytest.fixture(scope="module")
def vision_server(mlxcore_server: ServerFactory, tiny_qwen2_vl: Path, media_dir: Path) -> Server:
    """``tiny_qwen2_vl`` served as ``tiny-vl`` with a small pixel limit, local files under
    ``media_dir`` and ``localhost`` as the only allowed media domain (private addresses
    allowed, so that a local HTTP server can stand in for a remote one)."""
    return start_like_reference(
        mlxcore_server,
        tiny_qwen2_vl,
        "--served-model-name",
        "tiny-vl",
        "--max-image-pixels",
        str(MAX_IMAGE_PIXELS),
        "--allowed-local-media-path",
        str(media_dir),
        "--allowed-media-domains",
        "localhost",
        "--allow-private-media-urls",
    )


@pytest.fixture(scope="module")
def reference(tiny_qwen2_vl: Path) -> Reference:
    """The mlx-vlm reference for ``tiny_qwen2_vl``."""
    return Reference(tiny_qwen2_vl)


@pytest.fixture(scope="session")
def tiny_gemma3_vl() -> Path:
    """A tiny Gemma 3 (SigLIP tower, sliding-window text layers, Gemma 3 tokenizer)."""
    return build_test_vlm("gemma3", seed=0)


@pytest.fixture(scope="module")
def media_http(media_dir: Path) -> Iterator[str]:
    """``http://localhost:PORT``: a real HTTP server on ``media_dir``."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(media_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
