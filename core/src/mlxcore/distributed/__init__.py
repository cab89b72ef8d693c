"""Serving one model over several ranks with mlx.distributed (docs/distributed.md,
docs/decisions/0013-distributed-serving.md).

* :mod:`~mlxcore.distributed.plan`: whether a model can be split (tensor or pipeline
  parallel) over a group, decided before any weight is read; backend availability.
* :mod:`~mlxcore.distributed.load`: a local model folder loaded split over a group.
* :mod:`~mlxcore.distributed.control`: rank 0's per-step message and the ranks'
  agreement check, over mlx's collectives.
* :mod:`~mlxcore.distributed.lockstep`: rank 0 leading each engine step and the other
  ranks following it; faults are final (a rank cannot rebuild in step).
* :mod:`~mlxcore.distributed.launch`: ``mlxcore launch``, the ranks of one group on
  this machine or over SSH.
"""
