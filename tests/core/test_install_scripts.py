"""The best-effort installers of the set-up (scripts/apt-install.sh and the two that use
it) say why they install nothing, and never fail the set-up."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def fake_bin(tmp_path: Path, **tools: str) -> Path:
    """A folder of tiny commands (``name -> what it prints``) put first on PATH."""
    folder = tmp_path / "bin"
    folder.mkdir(parents=True)
    for name, output in tools.items():
        path = folder / name
        path.write_text(f"#!/bin/sh\necho {output}\n")
        path.chmod(0o755)
    return folder


def apt_install(tmp_path: Path, **tools: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{fake_bin(tmp_path, **tools)}:/usr/bin:/bin"}
    script = f'source "{REPO}/scripts/apt-install.sh"; apt_install demo demo-pkg "a hint"'
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)


def test_not_root_and_not_linux_say_why(tmp_path: Path) -> None:
    done = apt_install(tmp_path, id="1000", uname="Linux")
    assert done.returncode == 0
    assert done.stdout.strip() == (
        "install-demo: skipped: not root (install it with: sudo apt-get install demo-pkg)"
    )
    other = apt_install(tmp_path / "mac", id="0", uname="Darwin")
    assert other.stdout.strip() == "install-demo: skipped: not Linux (a hint)"


def test_chromium_install_can_be_skipped() -> None:
    env = {**os.environ, "MLXCORE_SKIP_CHROMIUM": "1"}
    done = subprocess.run(
        ["bash", str(REPO / "scripts/install-chromium.sh")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "skipped: MLXCORE_SKIP_CHROMIUM=1" in done.stdout
