"""Finding the sequence that makes decode steps fail, without failing the others.

When a decode step raises and the decoder can give its sequences back intact
(:meth:`~mlxcore.engine.strategies.Decoder.salvage`), the engine retries with half of
the suspects and holds the other half here; after each step that goes through it lets the
next held group back in, and those become the suspects. Sequences that went through a
step are cleared. A step that fails again splits its suspects again, so the sequence at
fault ends up alone and fails alone, after about log2(batch size) + 1 failed steps;
every other sequence goes on with its own cache, exactly as it would have.
"""

from __future__ import annotations

from collections.abc import Callable

from mlxcore.engine.strategies import DecodeSequence


class Quarantine:
    """Groups of sequences held out of the decode batch, in the order they go back."""

    def __init__(self) -> None:
        self.groups: list[list[DecodeSequence]] = []
        self.suspects: set[int] | None = None
        """Uids that may have made the last step fail (``None``: every sequence)."""
        self.isolated = 0
        """Sequences found at fault and failed alone."""

    def __bool__(self) -> bool:
        return bool(self.groups)

    def __len__(self) -> int:
        return sum(len(group) for group in self.groups)

    def suspected(self, rows: list[DecodeSequence]) -> list[DecodeSequence]:
        """Those of ``rows`` that may have made the step fail."""
        if self.suspects is None:
            return list(rows)
        return [seq for seq in rows if seq.uid in self.suspects]

    def split(self, suspects: list[DecodeSequence]) -> list[DecodeSequence]:
        """The suspects of a failed step (two or more): hold half back (they go back in
        first, once a step goes through); return the half to retry now (still suspects)."""
        half = max(1, len(suspects) // 2)
        self.groups.insert(0, suspects[half:])
        self.suspects = {seq.uid for seq in suspects[:half]}
        return suspects[:half]

    def release(self, alive: Callable[[int], bool]) -> list[DecodeSequence]:
        """The next held group, without the sequences that ended meanwhile; they are the
        suspects now (what ran before them went through a step). Nothing held: nobody is
        suspected any more."""
        while self.groups:
            group = [seq for seq in self.groups.pop(0) if alive(seq.uid)]
            if group:
                self.suspects = {seq.uid for seq in group}
                return group
        self.suspects = None
        return []

    def clear(self) -> None:
        """Forget every held sequence (the engine failed them)."""
        self.groups.clear()
        self.suspects = None
