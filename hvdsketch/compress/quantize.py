"""Unbiased stochastic rounding to a few levels, shared by QSGD and TernGrad.

Each bucket of ``B`` coordinates travels as one scale ``c >= max |v_i|`` and one small signed integer each,
both allgathered (:func:`hvdsketch.ops.contract.Ops.stochastic_round`)::

    y_i = s v_i / c,   code_i = floor(y_i + u_i),   u_i ~ U[0, 1)

so ``c * code_i / s`` is an unbiased estimate of ``v_i`` with ``s`` levels per sign: the papers' distribution.
"""
from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any, ClassVar, Sequence

from hvdsketch.compress import seeds
from hvdsketch.compress.base import Compressor, Message, TensorContext
from hvdsketch.compress.support import flat_out
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops


def code_dtype(levels: int) -> str:
    """The smallest signed integer type holding codes in ``[-levels, levels]``."""
    return "int8" if levels <= 127 else "int16"


class StochasticQuantizer(Compressor):
    """Base of QSGD and TernGrad: subclasses set ``levels``, ``bucket`` (``None``: whole), ``seed`` and the scale."""

    overflows: ClassVar[bool] = True

    levels: int
    bucket: int | None
    seed: int

    @abstractmethod
    def scales(self, ops: Ops, flat: Any, size: int) -> Any:
        """One scale per bucket of ``size`` consecutive entries of ``flat``, at least the bucket's largest ``|v_i|``."""

    def bucket_size(self, n: int) -> int:
        return n if self.bucket is None else min(self.bucket, n)

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        ops = backend(tensor)
        flat = ops.flatten(tensor)
        size = self.bucket_size(math.prod(ctx.shape))
        scales = self.scales(ops, flat, size)
        divisor = scales + ops.cast(scales == 0, ops.dtype_name(scales))  # 1 for all-zero buckets: their codes are 0
        # each rank draws its own: independent rounding errors are what averaging over ranks shrinks
        seed = seeds.derive(self.seed, ctx.name, ctx.step, f"{self.name}.rank{ctx.rank}")
        codes = ops.stochastic_round(flat, self.levels / divisor, size, self.levels, seed, code_dtype(self.levels))
        return [Message(scales, "allgather"), Message(codes, "allgather")], None

    def decompress(self, reduced: Sequence[Any], state: Any, ctx: TensorContext) -> Any:
        """The mean over ranks of ``scale * code / levels``, the ``1 / (levels N)`` folded into the scales."""
        scales, codes = reduced
        ops = backend(scales)
        codes = ops.reshape(codes, (ctx.world_size, -1))
        per_rank = ops.reshape(scales / (self.levels * ctx.world_size), (ctx.world_size, -1))
        average = ops.scaled_sum(codes, per_rank, self.bucket_size(math.prod(ctx.shape)), flat_out(ops, ctx.out))
        return ops.reshape(average, ctx.shape)
