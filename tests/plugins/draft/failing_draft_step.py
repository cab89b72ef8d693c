"""A test plugin: the draft decoder, whose decode step raises once for each request that
asks with ``"fail_step": true`` (the engine then fails the batch and builds a new decoder)."""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.engine.strategies import StepToken
from mlxcore.model_info import ModelInfo
from mlxcore.resources import ModelResources
from mlxcore_draft import DraftModel
from mlxcore_draft.decoder import DraftDecoder

FIRED: set[int] = set()
"""Request uids whose step already failed (once each, whatever decoder instance runs)."""


class FailingDraftDecoder(DraftDecoder):
    """The draft decoder with one injected step failure per asking request."""

    name = "failing-draft"

    def step(self) -> dict[int, list[StepToken]]:
        plain = [slot.seq for slot in self.plain.slots] + list(self.plain._joining)
        for seq in [row.seq for row in self.rows] + list(self.joining) + plain:
            if seq.request.options.get("fail_step") and seq.uid not in FIRED:
                FIRED.add(seq.uid)
                raise RuntimeError(f"injected step failure (request {seq.uid})")
        return super().step()


@hookimpl
def mlxcore_decoder(
    model: Any, info: ModelInfo, config: ServerConfig, resources: ModelResources
) -> FailingDraftDecoder | None:
    """Around the draft the draft plugin loaded."""
    draft = resources.get(DraftModel)
    if draft is None:
        return None
    return FailingDraftDecoder(model, draft.model, num_speculative_tokens=2, auto_off=False)
