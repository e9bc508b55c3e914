"""The dense reduce-scatters: FSDP's own, and 16-bit transport summed in float32 by the owner."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Sequence

from hvdsketch.compress.base import Message, TensorContext
from hvdsketch.compress.scatter.base import ScatterCompressor, block_shape, equal_splits
from hvdsketch.ops import backend


@dataclass(frozen=True)
class ScatterNone(ScatterCompressor):
    """The tensor reduce-scattered as it is, with the average op: FSDP's own reduction, bit for bit.

    Bytes: ``(N - 1) / N`` of the tensor (a ring reduce-scatter). Host syncs: none.
    """

    name: ClassVar[str] = "none"

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        block_shape(ctx)
        return [Message(tensor, "reduce_scatter")], None

    def decompress(self, reduced: Sequence[Any], local: Any, ctx: TensorContext) -> Any:
        return reduced[0]

    def residual(self, tensor: Any, messages: Sequence[Message], local: Any, ctx: TensorContext) -> None:
        """Nothing: the tensor travels whole."""
        return None


def accumulator(dtype: str) -> str:
    """The dtype sums are taken in: float32, or float64 for a float64 tensor."""
    return "float64" if dtype == "float64" else "float32"


@dataclass(frozen=True)
class ScatterHalf(ScatterCompressor):
    """Each block cast to 16 bits and sent to its owner (one alltoall); the owner sums the ``N`` blocks it
    receives in float32 and divides by ``N``.

    Only each rank's block is rounded, once. ``bfloat16`` keeps float32's range; with ``float16`` values beyond
    65504 overflow to Inf (the exchange then raises). With a residual memory the rounding is fed back.

    Bytes: ``(N - 1) / N`` of the tensor at 2 bytes an element. Host syncs: none.

    Options (flag ``fp16:dtype=bfloat16``):
      dtype  the wire's 16-bit float: float16 (default) or bfloat16
    """

    name: ClassVar[str] = "fp16"

    dtype: Literal["float16", "bfloat16"] = "float16"

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        ops = backend(tensor)
        count = math.prod(block_shape(ctx))
        wire = ops.cast(ops.flatten(tensor), self.dtype)
        return [Message(wire, "alltoall", **equal_splits(count, ctx.world_size))], ops.dtype_name(tensor)

    def decompress(self, reduced: Sequence[Any], dtype: str, ctx: TensorContext) -> Any:
        """The mean of the blocks received (one a rank), summed in float32."""
        ops, shape = backend(reduced[0]), block_shape(ctx)
        blocks = ops.reshape(ops.cast(reduced[0], accumulator(dtype)), (-1, math.prod(shape)))
        average = ops.reduce_sum(blocks, axis=0) / ops.shape(blocks)[0]
        return ops.reshape(ops.cast(average, dtype), shape)

    def residual(self, tensor: Any, messages: Sequence[Message], dtype: str, ctx: TensorContext) -> Any:
        """The rounding of every block this rank sent: ``tensor`` less its 16-bit copy."""
        ops = backend(tensor)
        return tensor - ops.reshape(ops.cast(messages[0].tensor, dtype), ctx.shape)
