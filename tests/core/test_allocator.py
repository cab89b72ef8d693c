"""glibc's allocation thresholds as the server sets them (``tune_allocator``): mid-size
buffers come from the heap (a fresh mapping per buffer made steps several times slower),
only very large ones are memory-mapped. Checked in a fresh interpreter: in a used one a
freed heap chunk may serve even a large request."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="mallopt and mallinfo2 are glibc's",
)

PROBE = """
import ctypes, ctypes.util, json
from mlxcore.engine.memory import MMAP_THRESHOLD_BYTES, tune_allocator

FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS.split()]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2

def mapped_while_holding(size):
    before = libc.mallinfo2().hblks
    pointer = libc.malloc(size)
    assert pointer
    try:
        return libc.mallinfo2().hblks - before
    finally:
        libc.free(pointer)

tuned = tune_allocator()
sizes = [2**20, 8 * 2**20, MMAP_THRESHOLD_BYTES + 2**20]
print(json.dumps({"tuned": tuned, "mapped": [mapped_while_holding(n) for n in sizes]}))
"""


def _probe(env: dict[str, str]) -> dict[str, object]:
    run = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    result: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def test_mid_size_buffers_come_from_the_heap_and_huge_ones_are_mapped() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MLXCORE_MALLOC_TUNING"}
    # 1 and 8 MiB: memory-mapped by the earlier 256 KiB threshold (and by glibc's own
    # 128 KiB until its threshold slides up); from the heap now; 33 MiB: mapped
    assert _probe(env) == {"tuned": True, "mapped": [0, 0, 1]}


def test_the_tuning_can_be_turned_off() -> None:
    result = _probe({**os.environ, "MLXCORE_MALLOC_TUNING": "0"})
    assert result == {"tuned": False, "mapped": [1, 1, 1]}  # glibc's fresh 128 KiB
