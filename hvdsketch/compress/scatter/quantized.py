"""A quantized reduce-scatter with error feedback: small integers and a scale per block of elements.

Each run of ``block`` elements travels to its owner as its largest magnitude ``m`` and codes
``code = round(x L / m)`` in ``[-L, L]`` (``L = 2^(bits - 1) - 1``), in one alltoall of codes and one of scales;
the owner sums ``code * m / L`` over the ranks in float32 and divides by ``N``. Rounding to the nearest level is
biased, so error feedback is part of the method (``feedback``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from hvdsketch.compress.base import Message, TensorContext
from hvdsketch.compress.scatter.base import ScatterCompressor, Units, block_shape, equal_splits
from hvdsketch.compress.scatter.dense import accumulator
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops


@dataclass(frozen=True)
class ScatterQuantize(ScatterCompressor):
    """Codes of ``bits`` bits with a scale per ``block`` elements to each block's owner, rounding fed back.

    Host syncs: none.

    Options (flag ``quantize:bits=8,block=256``):
      bits   bits a code: 8 (default), 4 or 2 (2 and 4 packed, four and two codes a byte)
      block  elements per scale (default 256; a multiple of the codes a byte)
    """

    name: ClassVar[str] = "quantize"
    feedback: ClassVar[bool] = True

    bits: int = 8
    block: int = 256

    def __post_init__(self) -> None:
        if self.bits not in (2, 4, 8):
            raise ValueError(f"bits must be 2, 4 or 8, got {self.bits}")
        if self.block < 1 or self.block % self.per_byte:
            raise ValueError(f"block must be a positive multiple of {self.per_byte} at {self.bits} bits, got {self.block}")

    @property
    def levels(self) -> int:
        """``L``: codes lie in ``[-L, L]``."""
        return 2 ** (self.bits - 1) - 1

    @property
    def per_byte(self) -> int:
        return 8 // self.bits

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        ops = backend(tensor)
        layout = Units.flat(ctx, self.block)
        runs = layout.matrix(ops, tensor)  # every rank's runs of ``block`` elements, in rank order
        scales = ops.bucket_norms(ops.flatten(runs), self.block, math.inf)
        divisor = scales + ops.cast(scales == 0, ops.dtype_name(scales))  # all-zero runs: codes 0
        codes = ops.cast(ops.floor(runs * ops.reshape(self.levels / divisor, (-1, 1)) + 0.5), "int8")
        per_rank = layout.units * layout.unit_len
        return [Message(self._packed(ops, ops.flatten(codes)), "alltoall", **equal_splits(per_rank // self.per_byte, layout.size)),
                Message(scales, "alltoall", **equal_splits(layout.units, layout.size))], (ops.dtype_name(tensor), layout)

    def decompress(self, reduced: Sequence[Any], local: tuple[str, Units], ctx: TensorContext) -> Any:
        """This rank's block: ``sum_r code_r * m_r / L``, in float32, over ``N``."""
        packed, scales = reduced
        dtype, layout = local
        ops = backend(scales)
        ranks = ops.shape(scales)[0] // layout.units
        codes = ops.reshape(self._unpacked(ops, packed), (ranks, -1))
        weights = ops.reshape(ops.cast(scales, accumulator(dtype)) / (self.levels * layout.size), (ranks, -1))
        block = ops.scaled_sum(codes, weights, self.block)
        if layout.padded:
            block = block[:layout.block_len]
        return ops.reshape(ops.cast(block, dtype), block_shape(ctx))

    def residual(self, tensor: Any, messages: Sequence[Message], local: tuple[str, Units], ctx: TensorContext) -> Any:
        """Every block this rank sent less what its codes carry: ``x - code * m / L``."""
        ops = backend(tensor)
        dtype, layout = local
        codes = ops.reshape(ops.cast(self._unpacked(ops, messages[0].tensor), dtype), (-1, self.block))
        sent = codes * ops.reshape(messages[1].tensor / self.levels, (-1, 1))
        return tensor - layout.unpadded(ops, ops.flatten(sent), ctx)

    def _packed(self, ops: Ops, codes: Any) -> Any:
        """int8 codes as they travel: as they are at 8 bits, else plus ``L``, ``per_byte`` a uint8, lowest first."""
        if self.bits == 8:
            return codes
        shifted = ops.reshape(ops.cast(codes, "int32") + self.levels, (-1, self.per_byte))
        weights = ops.constant([2 ** (self.bits * j) for j in range(self.per_byte)], "int32", shifted)
        return ops.cast(ops.reduce_sum(shifted * weights, axis=1), "uint8")

    def _unpacked(self, ops: Ops, packed: Any) -> Any:
        """The int8 codes of :meth:`_packed`'s bytes."""
        if self.bits == 8:
            return packed
        grouped = ops.reshape(ops.cast(packed, "int32"), (-1, 1))
        weights = ops.constant([2 ** (self.bits * j) for j in range(self.per_byte)], "int32", grouped)
        digits = (grouped // weights) % (2 ** self.bits)
        return ops.cast(ops.flatten(digits) - self.levels, "int8")
