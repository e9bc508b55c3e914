"""Unbiased stochastic rounding to a few levels, shared by QSGD and TernGrad.

A flat tensor is cut into buckets of ``B`` coordinates; each bucket travels as
one scale ``c >= max |v_i|`` and one small signed integer per coordinate::

    x_i = s |v_i| / c,   code_i = sgn(v_i) * (floor(x_i) + 1[u_i < x_i - floor(x_i)]),   u_i ~ U[0, 1)

so ``E[code_i] = sgn(v_i) x_i`` and ``c * code_i / s`` is an unbiased estimate
of ``v_i`` using ``s`` levels per sign. Scales and codes are allgathered, so
every rank decodes every rank's buckets and averages them.
"""
from __future__ import annotations

import math
from abc import abstractmethod
from types import ModuleType
from typing import Any, Sequence

from hvdsketch.compress import seeds
from hvdsketch.compress.base import Compressor, Message, TensorContext
from hvdsketch.ops import backend


def code_dtype(levels: int) -> str:
    """The smallest signed integer type holding codes in ``[-levels, levels]``."""
    return "int8" if levels <= 127 else "int16"


def average_scaled(ops: ModuleType, rows: Any, scales: Any, world_size: int) -> Any:
    """Mean over ranks of ``rows * scales[:, None]``, whose rows are each rank's in turn, as one flat vector
    (the ``1 / world_size`` goes into the scales: one pass over the tensor fewer)."""
    return ops.reduce_sum(ops.reshape(rows * (scales / world_size)[:, None], (world_size, -1)), axis=0)


class StochasticQuantizer(Compressor):
    """Base of QSGD and TernGrad: subclasses set ``levels``, ``bucket`` (``None``: the whole
    tensor), ``seed`` and the bucket scale."""

    levels: int
    bucket: int | None
    seed: int

    @abstractmethod
    def scales(self, ops: ModuleType, magnitudes: Any) -> Any:
        """One scale per row of ``magnitudes`` (the buckets' ``|v_i|``), at least the row's largest."""

    def bucket_size(self, n: int) -> int:
        return n if self.bucket is None else min(self.bucket, n)

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        ops = backend(tensor)
        dtype = ops.dtype_name(tensor)
        n = math.prod(ctx.shape)
        size = self.bucket_size(n)
        buckets = ops.reshape(ops.pad(ops.flatten(tensor), -n % size), (-1, size))
        magnitudes = abs(buckets)
        scales = self.scales(ops, magnitudes)
        divisor = scales + ops.cast(scales == 0, dtype)  # 1 for all-zero buckets: their codes are 0
        x = magnitudes * (self.levels / divisor)[:, None]
        low = ops.floor(x)
        # each rank rounds with its own draws: shared ones would correlate the ranks' rounding errors,
        # and their average would keep one rank's variance instead of 1/N of it
        u = ops.uniform(ops.shape(x), seeds.derive(self.seed, ctx.name, ctx.step, f"{self.name}.rank{ctx.rank}"), x)
        level = ops.clip(low + ops.cast(u < x - low, dtype), high=self.levels)  # x may exceed s by rounding
        codes = ops.cast(ops.sign(buckets) * level, code_dtype(self.levels))
        return [Message(scales, "allgather"), Message(ops.flatten(codes), "allgather")], None

    def decompress(self, reduced: Sequence[Any], state: Any, ctx: TensorContext) -> Any:
        scales, codes = reduced
        ops = backend(scales)
        n = math.prod(ctx.shape)
        rows = ops.reshape(ops.cast(codes, ops.dtype_name(scales)), (-1, self.bucket_size(n)))
        average = average_scaled(ops, rows, scales / self.levels, ctx.world_size)
        return ops.reshape(average[:n], ctx.shape)
