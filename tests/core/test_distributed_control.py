"""The per-step control channel between two real ring ranks on 127.0.0.1: every rank
hears rank 0's messages (nothing, short, large, with zero bytes) with every rank's
checksum, and the agreement check shows each rank's value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxcore.testing.ranks import run_ranks

pytestmark = pytest.mark.xdist_group("ranks")

RANK_SCRIPT = """
import hashlib, json, random
import mlx.core as mx
from mlxcore.distributed.control import ControlChannel

group = mx.distributed.init(strict=True, backend="ring")
channel = ControlChannel(group)
big = random.Random(5).randbytes(300_000)
sent = [None, b"admit 1", None, None, big, b"\\x00\\x00tail", b"last"]
heard = []
checksums = []
for step, message in enumerate(sent):
    got, sums = channel.exchange(
        message if group.rank() == 0 else b"ignored on this rank", 10 * step + group.rank()
    )
    heard.append(None if got is None else hashlib.sha256(got).hexdigest())
    checksums.append(sums)
same = channel.agree(1234)
split = channel.agree(1000 + group.rank())
print(json.dumps({"rank": group.rank(), "heard": heard, "same": same, "split": split,
                  "messages": channel.messages, "checksums": checksums}), flush=True)
"""


def test_every_rank_hears_rank_zero_and_sees_each_value(tmp_path: Path) -> None:
    import hashlib
    import random

    big = random.Random(5).randbytes(300_000)
    sent = [None, b"admit 1", None, None, big, b"\x00\x00tail", b"last"]
    expected = [None if m is None else hashlib.sha256(m).hexdigest() for m in sent]
    result = run_ranks(["-c", RANK_SCRIPT], 2, tmp_path, timeout=60)
    assert result.codes == [0, 0], result.stderr
    for rank, out in enumerate(result.stdout):
        report = json.loads(out.strip().splitlines()[-1])
        assert report["rank"] == rank
        assert report["heard"] == expected
        assert report["messages"] == 4  # the steps with nothing new cost no second collective
        assert report["same"] == [1234, 1234]
        assert report["split"] == [1000, 1001]
        assert report["checksums"] == [[10 * step, 10 * step + 1] for step in range(len(sent))]
