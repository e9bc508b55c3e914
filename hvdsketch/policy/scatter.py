"""The policies of a reduce-scatter (FSDP's gradient reduction): one method for every module, or ``auto``.

What ``compression=`` of :func:`hvdsketch.torch.fsdp.compress` accepts: a reduce-scatter method's
flag (:mod:`hvdsketch.compress.scatter`: ``none``, ``fp16:dtype=bfloat16``, ``quantize``, ``rows``)
as a :class:`~hvdsketch.policy.base.Fixed` policy; ``auto[:...]``, the cost model pricing those
methods per FSDP module (:class:`ScatterAutoPolicy`); or a policy object as it is.
"""
from __future__ import annotations

from typing import Any

from hvdsketch import spec as _spec
from hvdsketch.compress import Compressor
from hvdsketch.compress import scatter
from hvdsketch.policy.base import Fixed, Policy


def create(compression: Any = None) -> Policy:
    """The reduce-scatter policy ``compression`` names; ``None`` falls back to
    ``HVDSKETCH_COMPRESSION``, then ``"none"``. Raises :class:`hvdsketch.spec.SpecError` naming the
    valid choices."""
    if isinstance(compression, Policy):
        return compression
    if isinstance(compression, Compressor):
        return Fixed(scatter.create(compression))
    if compression is not None and not isinstance(compression, str):
        raise _spec.SpecError(f"compression of a reduce-scatter must be a flag ({', '.join(sorted(scatter.REGISTRY))} "
                              f"or auto), a reduce-scatter method or a policy, got {type(compression).__name__}")
    return Fixed(scatter.create(str(_spec.resolve(compression))))
