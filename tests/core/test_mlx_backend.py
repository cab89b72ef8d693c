"""Which MLX backend the set-up installs and what follows from it: ``scripts/mlx-backend``
(the extra ``make setup`` syncs), the CUDA wheel's effects on the OpenBLAS preload and the
default model's storage type, the memory the budget is taken from, the device a bench
records, and the ``cpu_wheel`` mark."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import mlx.core as mx
import pytest

from mlxcore import blas
from mlxcore.bench.report import device_text, machine_facts
from mlxcore.engine.memory import device_memory, physical_memory
from mlxcore.models.default import DTYPE_ENV, default_model_dtype

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mlx-backend"


def _backend(tmp_path: Path, smi_output: str | None, **env: str) -> subprocess.CompletedProcess:
    """Run the script with a fake ``nvidia-smi`` printing ``smi_output`` (None: none). The
    PATH holds only the tools the script uses, so a real ``nvidia-smi`` (a GPU machine's)
    is out of sight."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("uname", "sed", "head", "cat", "sh"):
        link = bin_dir / tool
        if not link.exists():
            link.symlink_to(shutil.which(tool) or f"/bin/{tool}")
    fake = bin_dir / "nvidia-smi"
    fake.unlink(missing_ok=True)
    if smi_output is not None:
        fake.write_text(f"#!/bin/sh\ncat <<'END'\n{smi_output}\nEND\n")
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    base = {k: v for k, v in os.environ.items() if k != "MLX_BACKEND"}
    bash = shutil.which("bash") or "/bin/bash"
    env = {**base, "PATH": str(bin_dir), **env}
    return subprocess.run([bash, str(SCRIPT)], env=env, capture_output=True, text=True)


def test_the_setup_picks_the_backend_the_driver_supports(tmp_path: Path) -> None:
    header = "| NVIDIA-SMI 575.57.08   Driver Version: 575.57.08   CUDA Version: {} |"
    assert _backend(tmp_path, None).stdout.strip() == "cpu"
    assert _backend(tmp_path, header.format("12.9")).stdout.strip() == "cuda12"
    assert _backend(tmp_path, header.format("13.0")).stdout.strip() == "cuda13"
    failing = _backend(tmp_path, "NVIDIA-SMI has failed: no driver")
    assert failing.stdout.strip() == "cpu" and "no CUDA 12 or 13 driver" in failing.stderr
    forced = _backend(tmp_path, header.format("13.0"), MLX_BACKEND="cpu")
    assert forced.stdout.strip() == "cpu"
    wrong = _backend(tmp_path, None, MLX_BACKEND="rocm")
    assert wrong.returncode == 1 and "cpu, cuda12 or cuda13" in wrong.stderr


@pytest.mark.cpu_wheel
def test_this_environment_runs_the_cpu_wheel() -> None:
    assert not blas.cuda_backend()
    assert mx.default_device() == mx.cpu
    assert device_memory() is None  # the budget is taken from RAM on the CPU backend
    assert physical_memory() == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    facts = machine_facts()
    assert facts["mlx_backend"].startswith("mlx-cpu ") and facts["mlx_device"] == "Device(cpu, 0)"
    assert device_text(facts).startswith("Device(cpu, 0)") and "mlx-cpu" in device_text(facts)


def test_on_cuda_nothing_preloads_openblas_and_the_default_model_is_bfloat16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (DTYPE_ENV, blas.REEXEC_ENV, blas.DISABLE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(blas, "cuda_backend", lambda: True)
    assert blas.reexec_env({}) is None
    assert default_model_dtype() == "bfloat16"


def test_a_gpu_report_names_the_card_and_the_wheel() -> None:
    facts = {
        "mlx_device": "Device(gpu, 0)",
        "device_name": "NVIDIA H100 80GB HBM3",
        "mlx_backend": "mlx-cuda-12 0.32.4",
    }
    assert device_text(facts) == "Device(gpu, 0) NVIDIA H100 80GB HBM3, mlx-cuda-12 0.32.4"
    assert device_text({}) == "?"


@pytest.mark.skipif(not blas.cuda_backend(), reason="MLX runs on its CPU wheel here")
def test_this_environment_runs_the_cuda_wheel() -> None:
    assert mx.default_device() == mx.gpu and mx.cuda.is_available()
    assert device_memory() == mx.device_info()["total_memory"]
    facts = machine_facts()
    assert facts["mlx_backend"].startswith("mlx-cuda-") and facts["mlx_device"] == "Device(gpu, 0)"


def test_float32_products_stay_exact_unless_the_user_chose() -> None:
    env: dict[str, str] = {}
    assert blas.keep_float32_exact(env) and env == {"MLX_ENABLE_TF32": "0"}
    chosen = {"MLX_ENABLE_TF32": "1"}
    assert not blas.keep_float32_exact(chosen) and chosen == {"MLX_ENABLE_TF32": "1"}
    # mlxcore's pytest plugin set it for this test process (and the servers it starts)
    # before any matrix product ran, as `mlxcore serve` does at start-up.
    assert os.environ["MLX_ENABLE_TF32"] == "0"
