"""Rank 0's per-step message to the other ranks, and the ranks' agreement check, over
mlx's own collectives (no other transport).

Every rank calls :meth:`ControlChannel.exchange` once per engine step, in the same
order: rank 0 with the step's message (bytes, or ``None`` when nothing changed), the
others with ``None``, each with a checksum of what it sampled so far; all of them get
rank 0's message and every rank's checksum back. It costs one ``all_gather`` of two
integers per rank when nothing changed (the common case while decoding) and an
``all_sum`` of the message's bytes otherwise. :meth:`ControlChannel.agree` compares one
integer per rank (a start-up fingerprint) with an ``all_gather``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mlxcore.errors import MlxcoreError


class ControlChannel:
    """The ranks of ``group`` in step: rank 0 speaks, every rank hears it.

    Attributes:
        seconds: total time spent in this channel's collectives (for ``/metrics``).
        messages: messages carried (steps with something new).
    """

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rank: int = group.rank()
        self.size: int = group.size()
        self.seconds = 0.0
        self.messages = 0

    def exchange(
        self, message: bytes | None = None, checksum: int = 0
    ) -> tuple[bytes | None, list[int]]:
        """Rank 0's ``message`` on every rank (``None``: nothing this step; other ranks'
        messages are ignored), and every rank's ``checksum`` in rank order.

        Raises:
            MlxcoreError: another rank announced a message (the group is broken: a rank
                was lost and the collective returned garbage).
        """
        import mlx.core as mx

        started = time.perf_counter()
        mine = message if self.rank == 0 and message else b""
        header = mx.array([len(mine), checksum & 0x7FFFFFFF], dtype=mx.int32)
        gathered = np.array(mx.distributed.all_gather(header, group=self.group)).reshape(-1, 2)
        size = int(gathered[0, 0])
        if gathered[1:, 0].any() or size < 0:
            raise MlxcoreError(
                f"the ranks' step headers make no sense ({gathered.tolist()}): a rank was lost"
            )
        received: bytes | None = None
        if size:
            payload = np.frombuffer(mine, dtype=np.uint8) if mine else np.zeros(size, np.uint8)
            summed = mx.distributed.all_sum(mx.array(payload), group=self.group)
            received = np.array(summed, dtype=np.uint8).tobytes()
            self.messages += 1
        self.seconds += time.perf_counter() - started
        return received, [int(v) for v in gathered[:, 1]]

    def agree(self, value: int) -> list[int]:
        """Every rank's ``value`` (e.g. a hash of the tokens it sampled since the last
        check), in rank order; the caller compares them."""
        import mlx.core as mx

        started = time.perf_counter()
        mine = mx.array([value & 0x7FFFFFFF], dtype=mx.int32)
        gathered = mx.distributed.all_gather(mine, group=self.group)
        values = [int(v) for v in np.array(gathered).reshape(-1)]
        self.seconds += time.perf_counter() - started
        return values
