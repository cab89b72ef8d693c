"""Second models that work beside the served one (a speculative draft, a prefill scorer):
loaded once, and refused unless they read and write the same tokens as the target."""

from __future__ import annotations

from mlxcore.errors import UsageError
from mlxcore.model_info import ModelInfo
from mlxcore.models.loader import LoadedModel, load_model


def tokenizer_difference(target: dict[str, int], draft: dict[str, int]) -> str | None:
    """Why two vocabularies (token text -> id, special tokens included) differ, or None."""
    if target == draft:
        return None
    for text, tid in sorted(target.items(), key=lambda item: item[1]):
        if draft.get(text) != tid:
            other = draft.get(text)
            where = "has no such token" if other is None else f"has it as id {other}"
            return f"the target's token {text!r} (id {tid}): the draft {where}"
    extra = sorted(set(draft) - set(target), key=lambda t: draft[t])
    return f"the draft has tokens the target lacks, e.g. {extra[0]!r} (id {draft[extra[0]]})"


def load_draft(source: str, target: ModelInfo, flag: str) -> LoadedModel:
    """Load the model ``source`` names (``flag``: the option that named it, for messages)
    and check that its tokenizer is the target's (:class:`UsageError` naming the first
    token that differs)."""
    loaded = load_model(source)
    if target.vocab:
        why = tokenizer_difference(target.vocab, loaded.info.vocab)
        if why is not None:
            raise UsageError(
                f"{flag} {source}: its tokenizer differs from the target's "
                f"({len(loaded.info.vocab)} vs {len(target.vocab)} tokens; {why})"
            )
    return loaded
