"""What a reduce-scatter method is: an exchange whose result is this rank's block of the average.

The tensor an exchange is given (``ctx.shape``) is cut along dimension 0 into
``ctx.world_size`` equal blocks, block ``q`` rank ``q``'s. The exchange returns
the average over ranks of block ``ctx.rank`` (:func:`block_shape`), written into
``ctx.out`` when given (FSDP's output). Error feedback works as for every
method: the residual is what this rank's messages leave out of the tensor it was
given, the whole tensor (every block it sent), never the block it received.
"""
from __future__ import annotations

from typing import Any, ClassVar, Sequence

from hvdsketch.compress.base import Compressor, Message, TensorContext


def block_shape(ctx: TensorContext) -> tuple[int, ...]:
    """The shape of one rank's block of a tensor of ``ctx.shape``; a ``ValueError`` where dimension 0
    does not split into ``ctx.world_size`` equal blocks."""
    rows, size = ctx.shape[0] if ctx.shape else 0, ctx.world_size
    if not ctx.shape or rows % size:
        raise ValueError(f"hvdsketch: a reduce-scatter of {ctx.name!r} needs dimension 0 of its shape "
                         f"{tuple(ctx.shape)} in {size} equal blocks")
    return (rows // size, *ctx.shape[1:])


def equal_splits(count: int, size: int) -> dict[str, tuple[int, ...]]:
    """An alltoall message's ``splits`` and ``received`` where every rank sends ``count`` rows to each."""
    return {"splits": (count,) * size, "received": (count,) * size}


class ScatterCompressor(Compressor):
    """Base of the reduce-scatter methods (see the module's docstring)."""

    def estimate(self, messages: Sequence[Message], local: Any, ctx: TensorContext) -> Any:
        raise NotImplementedError(f"hvdsketch: {self.name} states its residual itself (a reduce-scatter's result "
                                  f"is a block, not the tensor sent)")
