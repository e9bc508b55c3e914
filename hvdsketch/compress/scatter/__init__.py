"""Reduce-scatter methods: FSDP's gradient reduction, each rank ending with its own block of the average.

Every rank gives the whole tensor, ``N`` equal blocks along dimension 0, and rank ``q`` gets the average of block
``q``. The methods are compressors (:class:`~hvdsketch.compress.Compressor`) whose exchange ends with that block
(:mod:`.base`):

- ``none``: FSDP's own reduce-scatter (:class:`~.dense.ScatterNone`);
- ``fp16``: 16-bit blocks to their owners, summed there in float32 (:class:`~.dense.ScatterHalf`);
- ``quantize``: 8, 4 or 2 bits, a scale per block, rounding fed back (:class:`~.quantized.ScatterQuantize`);
- ``rows``: only the non-zero rows to their owners, exact (:class:`~.rows.ScatterRows`).

:func:`create` turns a flag into one; :data:`REGISTRY` maps every flag name to its class.
"""
from __future__ import annotations

from hvdsketch import spec as _spec
from hvdsketch.compress.base import Compressor
from hvdsketch.compress.scatter.base import ScatterCompressor, block_shape
from hvdsketch.compress.scatter.dense import ScatterHalf, ScatterNone
from hvdsketch.compress.scatter.quantized import ScatterQuantize
from hvdsketch.compress.scatter.rows import ScatterRows

REGISTRY: dict[str, type[ScatterCompressor]] = {cls.name: cls for cls in (ScatterNone, ScatterHalf, ScatterQuantize,
                                                                   ScatterRows)}


def create(flag: "str | _spec.Spec | Compressor", **options) -> ScatterCompressor:
    """The reduce-scatter method a flag names (``"fp16:dtype=bfloat16"``); raises :class:`hvdsketch.spec.SpecError`
    naming the valid choices, or where a compressor object is not a reduce-scatter method."""
    if isinstance(flag, ScatterCompressor):
        return flag
    if isinstance(flag, Compressor):
        raise _spec.SpecError(f"{flag} averages whole tensors; a reduce-scatter takes one of "
                              f"{', '.join(sorted(REGISTRY))}")
    return _spec.build(flag, REGISTRY, kind="reduce-scatter method", **options)


__all__ = ["REGISTRY", "ScatterCompressor", "ScatterHalf", "ScatterNone", "ScatterQuantize", "ScatterRows", "block_shape", "create"]
