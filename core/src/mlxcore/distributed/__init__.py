"""Serving one model over several ranks with mlx.distributed (issue 18, in progress; see
docs/decisions/0013-distributed-serving.md).

* :mod:`~mlxcore.distributed.plan`: whether a model can be split (tensor or pipeline
  parallel) over a group, decided before any weight is read; backend availability.
* :mod:`~mlxcore.distributed.load`: a local model folder loaded split over a group.
* :mod:`~mlxcore.distributed.control`: rank 0's per-step message and the ranks'
  agreement check, over mlx's collectives.
"""
