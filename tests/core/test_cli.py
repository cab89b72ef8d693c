"""The `mlxcore` command as a user runs it: real subprocesses, real models."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

NAMED = ("qwen35-mtp", "gemma4", "minimax", "specprefill")


def mlxcore(
    *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if cwd is not None:
        env["PYTHONPATH"] = f"{cwd}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run(
        [sys.executable, "-m", "mlxcore", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )


def test_version_and_help() -> None:
    out = mlxcore("--version")
    assert out.returncode == 0 and out.stdout.startswith("mlxcore ")
    helped = mlxcore("serve", "--help")
    assert helped.returncode == 0
    for flag in (
        "--served-model-name",
        "--max-num-seqs",
        "--tool-call-parser",
        "--enable-auto-tool-choice",  # vLLM's, accepted (tool calls need only the parser)
        "--host",
        "--plugin",
    ):
        assert flag in helped.stdout


def test_plugins_lists_the_named_plugins_with_versions() -> None:
    out = mlxcore("plugins")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:] if line.strip()}
    for name in NAMED:
        assert name in rows, out.stdout
        assert rows[name][1] == f"mlxcore-{name}"
        assert rows[name][2][0].isdigit()


def test_generate_streams_text_through_the_engine(tiny_llama: Path) -> None:
    out = mlxcore(
        "generate", str(tiny_llama), "-p", "hello", "--max-tokens", "6", "--log-level", "INFO",
        "--request-options", '{"speculative": false}',  # a plugin option, checked and taken
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert "finish=length" in out.stderr or "finish=stop" in out.stderr


def test_unknown_plugin_exits_non_zero_listing_installed(tiny_llama: Path) -> None:
    out = mlxcore("generate", str(tiny_llama), "-p", "x", "--plugin", "no-such-thing")
    assert out.returncode == 2
    assert "no-such-thing" in out.stderr
    for name in NAMED:
        assert name in out.stderr


def test_plugin_configure_error_is_one_plain_line(tiny_llama: Path) -> None:
    out = mlxcore("generate", str(tiny_llama), "-p", "x", "--plugin", "specprefill")
    assert out.returncode == 2
    assert "specprefill-draft-model" in out.stderr
    assert "Traceback" not in out.stderr


def test_plugin_failing_at_set_up_names_itself(tiny_llama: Path, tmp_path: Path) -> None:
    (tmp_path / "exploding_patch.py").write_text(
        textwrap.dedent(
            """
            def mlxcore_patch_model(model, info, config):
                raise RuntimeError("cannot patch this model")
            """
        )
    )
    out = mlxcore(
        "generate", str(tiny_llama), "-p", "x", "--plugin", "exploding_patch", cwd=tmp_path
    )
    assert out.returncode == 2
    assert "exploding_patch" in out.stderr and "mlxcore_patch_model" in out.stderr
    assert "cannot patch this model" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_model_that_cannot_quantize_its_cache_is_refused_in_one_line(
    tiny_gemma4: Path,
) -> None:
    out = mlxcore("generate", str(tiny_gemma4), "-p", "x", "--kv-cache-dtype", "int8")
    assert out.returncode == 2
    assert "--kv-cache-dtype int8" in out.stderr and "sliding-window" in out.stderr
    assert "Traceback" not in out.stderr
    out = mlxcore("generate", str(tiny_gemma4), "-p", "x", "--kv-cache-dtype", "fp8")
    assert out.returncode == 2 and "invalid choice: 'fp8'" in out.stderr


def test_bad_model_path_is_a_clear_error(tmp_path: Path) -> None:
    out = mlxcore("generate", str(tmp_path / "nowhere"), "-p", "x")
    assert out.returncode == 2
    assert "nowhere" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_generate_with_the_embedded_default_answers_paris() -> None:
    out = mlxcore("generate", "-p", "What is the capital of France?", "--max-tokens", "40")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
