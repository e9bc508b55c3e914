"""What a reduce-scatter method is: an exchange whose result is this rank's block of the average.

The tensor (``ctx.shape``) is cut along dimension 0 into ``ctx.world_size`` equal blocks, block ``q`` rank ``q``'s;
the exchange returns the average of block ``ctx.rank`` (:func:`block_shape`), into ``ctx.out`` when given. The
residual is what this rank's messages leave out of the whole tensor it was given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from hvdsketch.compress.base import Compressor, Message, TensorContext
from hvdsketch.ops.contract import Ops


def block_shape(ctx: TensorContext) -> tuple[int, ...]:
    """The shape of one rank's block of ``ctx.shape``; ``ValueError`` unless dimension 0 splits into equal blocks."""
    rows, size = ctx.shape[0] if ctx.shape else 0, ctx.world_size
    if not ctx.shape or rows % size:
        raise ValueError(f"hvdsketch: a reduce-scatter of {ctx.name!r} needs dimension 0 of its shape "
                         f"{tuple(ctx.shape)} in {size} equal blocks")
    return (rows // size, *ctx.shape[1:])


def equal_splits(count: int, size: int) -> dict[str, tuple[int, ...]]:
    """An alltoall message's ``splits`` and ``received`` where every rank sends ``count`` rows to each."""
    return {"splits": (count,) * size, "received": (count,) * size}


@dataclass(frozen=True)
class Units:
    """A tensor of ``size`` blocks, each ``block_len`` elements zero-padded to ``units`` units of ``unit_len``."""

    size: int
    units: int
    unit_len: int
    block_len: int

    @classmethod
    def rows(cls, ctx: TensorContext, block: int) -> "Units":
        """A block's rows where ``ctx.shape`` has them, else its elements ``block`` at a time."""
        shape = block_shape(ctx)
        if len(shape) >= 2:
            return cls(ctx.world_size, shape[0], math.prod(shape) // max(shape[0], 1), math.prod(shape))
        return cls.flat(ctx, block)

    @classmethod
    def flat(cls, ctx: TensorContext, block: int) -> "Units":
        """A block's elements ``block`` at a time."""
        numel = math.prod(block_shape(ctx))
        return cls(ctx.world_size, -(-numel // block), block, numel)

    @property
    def padded(self) -> bool:
        return self.units * self.unit_len != self.block_len

    def matrix(self, ops: Ops, tensor: Any) -> Any:
        """``tensor`` as the ``size * units x unit_len`` matrix (a view unless blocks are padded)."""
        flat = ops.flatten(tensor)
        if self.padded:
            zeros = ops.zeros(self.units * self.unit_len - self.block_len, ops.dtype_name(flat), flat)
            flat = ops.concat([piece for block in self._blocks(flat, self.block_len) for piece in (block, zeros)])
        return ops.reshape(flat, (self.size * self.units, self.unit_len))

    def unpadded(self, ops: Ops, flat: Any, ctx: TensorContext) -> Any:
        """A padded flat tensor of every block back in ``ctx.shape``."""
        if self.padded:
            flat = ops.concat([block[:self.block_len] for block in self._blocks(flat, self.units * self.unit_len)])
        return ops.reshape(flat, ctx.shape)

    def _blocks(self, flat: Any, length: int) -> list[Any]:
        return [flat[q * length:(q + 1) * length] for q in range(self.size)]


class ScatterCompressor(Compressor):
    """Base of the reduce-scatter methods (see the module's docstring)."""

    def estimate(self, messages: Sequence[Message], local: Any, ctx: TensorContext) -> Any:
        raise NotImplementedError(f"hvdsketch: {self.name} states its residual itself (a reduce-scatter's result "
                                  f"is a block, not the tensor sent)")
