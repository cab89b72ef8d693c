"""Several LoRA adapters on one model's shared weights, chosen per row of a batch.

Each adapted linear layer of the model is replaced, on this model instance only, by a
:class:`RowLoRALinear` that keeps the original layer and every loaded adapter's
low-rank pair for it. Before each forward pass the engine says which adapter each row
runs with (:meth:`AdapterBank.select`); the layer then adds, to the base output of each
row, that row's adapter delta, computed exactly as mlx-lm's ``LoRALinear`` computes it
(``y + (scale * ((x @ lora_a) @ lora_b)).astype(x.dtype)``) on the rows of that adapter
only: rows of the base model, or of an adapter that does not touch this layer, get the
base output unchanged. No weights are fused or copied per adapter, and nothing is
reloaded between requests.

Adapters are installed and removed on the engine thread (at load, or as an engine job
between two steps), so a forward pass never sees a half-installed adapter.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from mlxcore_lora.folder import AdapterError, AdapterWeights, linear_dims


@attrs.frozen
class RowPlan:
    """Which rows of the next forward pass run which adapter.

    ``uniform``: the key every row runs with (the fast path: no gather). Otherwise
    ``groups`` lists (key or ``None`` for the base model, row indices, row count) and
    ``inverse`` puts the rows of the groups, concatenated in order, back in batch order.
    """

    uniform: int | None
    groups: tuple[tuple[int | None, mx.array, int], ...] = ()
    inverse: mx.array | None = None

    @classmethod
    def build(cls, keys: Sequence[int | None]) -> RowPlan:
        """The plan for a batch whose row ``i`` runs ``keys[i]``."""
        if all(k == keys[0] for k in keys):
            return cls(keys[0])
        rows: dict[int | None, list[int]] = {}
        for i, key in enumerate(keys):
            rows.setdefault(key, []).append(i)
        order = [i for members in rows.values() for i in members]
        inverse = [0] * len(order)
        for position, i in enumerate(order):
            inverse[i] = position
        groups = tuple((key, mx.array(members), len(members)) for key, members in rows.items())
        return cls(None, groups, mx.array(inverse))


class RowLoRALinear(nn.Module):
    """A linear layer plus the low-rank pairs of every adapter that adapts it."""

    def __init__(self, base: nn.Module, bank: AdapterBank) -> None:
        super().__init__()
        self.base = base
        self.lora: dict[str, dict[str, mx.array]] = {}
        """Adapter key (as text) -> {"a": lora_a, "b": lora_b}; parameters, so the
        model's parameter bytes count them."""
        self._bank = bank

    def _delta(self, key: int | None, x: mx.array) -> mx.array | None:
        pair = None if key is None else self.lora.get(str(key))
        if pair is None:
            return None
        assert key is not None
        scale = self._bank.scales[key]
        return (scale * ((x @ pair["a"]) @ pair["b"])).astype(x.dtype)

    def __call__(self, x: mx.array) -> mx.array:
        y = self.base(x)
        plan = self._bank.plan
        if plan is None or not self.lora:
            return y
        if plan.groups == ():
            delta = self._delta(plan.uniform, x)
            return y if delta is None else y + delta
        parts: list[mx.array | None] = [self._delta(key, x[rows]) for key, rows, _ in plan.groups]
        if all(part is None for part in parts):
            return y
        filled = [
            mx.zeros((n, *y.shape[1:]), y.dtype) if part is None else part
            for part, (_, _, n) in zip(parts, plan.groups, strict=True)
        ]
        assert plan.inverse is not None
        return y + mx.concatenate(filled, axis=0)[plan.inverse]


@attrs.define(eq=False)
class _Served:
    weights: AdapterWeights
    key: int


class AdapterBank:
    """The adapters served on one model instance (:class:`mlxcore.engine.adapters.Adapters`)."""

    def __init__(self, model: nn.Module, max_adapters: int) -> None:
        self.model = model
        self.max_adapters = max_adapters
        self.plan: RowPlan | None = None
        """Read by every adapted layer during a forward pass (:meth:`select`)."""
        self.scales: dict[int, float] = {}
        self._served: dict[str, _Served] = {}
        self._hidden: set[str] = set()
        """Adapters being unloaded: no new request gets them."""
        self._keys = itertools.count(1)
        self._last: tuple[tuple[int | None, ...], RowPlan] | None = None
        self._layers: dict[str, RowLoRALinear] = {}
        self.targets: dict[str, tuple[int, int]] = {}
        """Module path -> (input, output) dims of every linear layer an adapter may adapt."""
        for path, module in model.named_modules():
            dims = linear_dims(module)
            if dims is not None and path:
                self.targets[path] = dims

    # -- the engine's side (mlxcore.engine.adapters.Adapters) ------------------------

    def names(self) -> list[str]:
        return [name for name in self._served if name not in self._hidden]

    def key(self, name: str) -> int | None:
        served = self._served.get(name)
        return None if served is None or name in self._hidden else served.key

    def has_key(self, key: int) -> bool:
        return key in self.scales

    def describe(self, name: str) -> dict[str, Any]:
        served = self._served.get(name)
        if served is None:
            return {}
        weights = served.weights
        return {"root": weights.path, "rank": weights.rank, "layers": len(weights.layers)}

    def select(self, keys: Sequence[int | None] | None) -> None:
        if keys is None:
            self.plan = None
            return
        frozen = tuple(keys)
        if self._last is not None and self._last[0] == frozen:
            self.plan = self._last[1]  # the same batch as the last step: same plan
            return
        self.plan = RowPlan.build(frozen)
        self._last = (frozen, self.plan)

    # -- installing and removing (on the engine thread) -----------------------------

    @property
    def nbytes(self) -> int:
        """Bytes of every served adapter's weights."""
        return sum(s.weights.nbytes for s in self._served.values())

    def install(self, weights: AdapterWeights) -> int:
        """Serve ``weights`` under its name; returns its key."""
        if weights.name in self._served:
            raise AdapterError(f"a LoRA adapter named {weights.name!r} is already loaded")
        if len(self._served) >= self.max_adapters:
            raise AdapterError(
                f"{len(self._served)} LoRA adapters are loaded, the most --max-loras allows; "
                "unload one first"
            )
        key = next(self._keys)
        self._wrap([path for path in weights.layers if path not in self._layers])
        for path, (a, b) in weights.layers.items():
            self._layers[path].lora[str(key)] = {"a": a, "b": b}
        self.scales[key] = weights.scale
        self._served[weights.name] = _Served(weights, key)
        self._last = None
        return key

    def hide(self, name: str) -> None:
        """Stop handing ``name`` to new requests (its running ones keep it)."""
        self._hidden.add(name)

    def show(self, name: str) -> None:
        """Hand ``name`` to new requests again (after :meth:`hide`)."""
        self._hidden.discard(name)

    def remove(self, name: str) -> AdapterWeights:
        """Stop serving ``name`` and drop its weights (raises ``KeyError`` if unknown)."""
        served = self._served.pop(name)
        self._hidden.discard(name)
        for path in served.weights.layers:
            self._layers[path].lora.pop(str(served.key), None)
        del self.scales[served.key]
        self._last = None
        return served.weights

    def _wrap(self, paths: list[str]) -> None:
        """Replace the linear layers at ``paths`` by :class:`RowLoRALinear` (this model
        instance only, as mlx-lm's own LoRA conversion does)."""
        if not paths:
            return
        modules = dict(self.model.named_modules())
        wrapped = []
        for path in paths:
            layer = RowLoRALinear(modules[path], self)
            self._layers[path] = layer
            wrapped.append((path, layer))
        self.model.update_modules(tree_unflatten(wrapped))
