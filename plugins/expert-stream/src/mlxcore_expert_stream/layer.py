"""A ``SwitchGLU`` whose routed experts live in slot tables filled from disk.

:class:`StreamedSwitchGLU` takes the place of one mlx-lm ``SwitchGLU`` on one model
instance (never the class): for each call it reads which experts the router chose (one
evaluation of the indices), makes them resident in its layer's slot tables
(:mod:`mlxcore_expert_stream.cache`) and runs the same ``gather_mm`` / ``gather_qmm``
mlx-lm runs, on the tables, with the indices renumbered to slots. The arithmetic per
token and expert is the same, so greedy output equals the fully loaded model's.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxcore_expert_stream.cache import ExpertCache

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def array_keys(linear: Any) -> tuple[str, ...]:
    """The arrays of one ``SwitchLinear`` / ``QuantizedSwitchLinear`` that stream, in the
    order the slot tables hold them: ``weight``, then ``scales`` and ``biases`` when
    quantized, then ``bias`` when the experts have one (gpt-oss)."""
    return tuple(k for k in ("weight", "scales", "biases", "bias") if k in linear)


SORT_FROM = 64
"""Sort the tokens by expert from this many (token, expert) pairs, as mlx-lm does."""


class StreamedSwitchGLU(nn.Module):
    """See the module docstring.

    Args:
        layer: the replaced module's path (the cache's key, the checkpoint's prefix).
        original: the ``SwitchGLU`` it replaces (read for its activation and, when
            quantized, group size, bits and mode; its arrays are not kept).
        cache: where the experts are.
    """

    def __init__(self, layer: str, original: Any, cache: ExpertCache) -> None:
        super().__init__()
        self._slots = cache.layers[layer]
        self._cache = cache
        self._activation = original.activation
        self._qargs: dict[str, dict[str, Any] | None] = {}
        """Per projection: group size, bits and mode when quantized (a model may leave
        one projection unquantized), else None."""
        self._keys: dict[str, tuple[str, ...]] = {}
        """Per projection: which array each of its tables is (:func:`array_keys`)."""
        for name in PROJECTIONS:
            linear = getattr(original, name)
            self._keys[name] = array_keys(linear)
            quantized = "scales" in linear
            self._qargs[name] = (
                {"group_size": linear.group_size, "bits": linear.bits, "mode": linear.mode}
                if quantized
                else None
            )
        self._experts = int(original.gate_proj.weight.shape[0])
        self.freeze()

    @property
    def cache(self) -> ExpertCache:
        """The cache this layer's experts come from."""
        return self._cache

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        indices = mx.stop_gradient(indices)
        routed = np.asarray(indices)
        chosen = np.unique(routed)
        slots = self._slots
        rounds = [chosen[i : i + slots.size] for i in range(0, len(chosen), slots.size)]
        result: mx.array | None = None
        for group in rounds:
            position = np.zeros(self._experts, dtype=np.uint32)
            position[group] = slots.place(group.tolist())
            out = self._run(x, mx.array(position)[indices], slots.tables)
            if len(rounds) == 1:
                return out
            inside = mx.array(np.isin(routed, group))[..., None]
            result = out if result is None else mx.where(inside, out, result)
            mx.eval(result)  # before the next round writes over the tables
        assert result is not None
        return result

    def _run(self, x: mx.array, local: mx.array, tables: dict[str, list[mx.array]]) -> mx.array:
        """mlx-lm's ``SwitchGLU`` arithmetic on the slot tables."""
        x = mx.expand_dims(x, (-2, -3))
        do_sort = local.size >= SORT_FROM
        idx, inverse = local, None
        if do_sort:
            flat = local.flatten()
            order = mx.argsort(flat)
            inverse = mx.argsort(order)
            x = x.flatten(0, -3)[order // local.shape[-1]]
            idx = flat[order]
        up = self._project("up_proj", x, tables["up_proj"], idx, do_sort)
        gate = self._project("gate_proj", x, tables["gate_proj"], idx, do_sort)
        x = self._project(
            "down_proj", self._activation(up, gate), tables["down_proj"], idx, do_sort
        )
        if inverse is not None:
            x = mx.unflatten(x[inverse], 0, local.shape)
        return x.squeeze(-2)

    def _project(
        self, name: str, x: mx.array, arrays: list[mx.array], idx: mx.array, sort: bool
    ) -> mx.array:
        named = dict(zip(self._keys[name], arrays, strict=True))
        qargs = self._qargs[name]
        if qargs is not None:
            out = mx.gather_qmm(
                x, named["weight"], named["scales"], named.get("biases"), rhs_indices=idx,
                transpose=True, sorted_indices=sort, **qargs,
            )  # fmt: skip
        else:
            out = mx.gather_mm(
                x, named["weight"].swapaxes(-1, -2), rhs_indices=idx, sorted_indices=sort
            )
        if "bias" in named:
            out = out + mx.expand_dims(named["bias"][idx], -2)
        return out
