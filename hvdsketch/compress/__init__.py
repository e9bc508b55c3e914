"""Gradient compressors, each written once against :mod:`hvdsketch.ops`.

:func:`create` turns a compression flag (``"sketch:error=0.5"``) into a
compressor; :data:`REGISTRY` maps every flag name to its class.
"""
from __future__ import annotations

from hvdsketch import spec as _spec
from hvdsketch.compress.allgather import Allgather
from hvdsketch.compress.balanced import Balanced
from hvdsketch.compress.base import Compressor, Message, Round, TensorContext
from hvdsketch.compress.dense import HalfPrecision, NoCompression
from hvdsketch.compress.dgc import DeepGradientCompression
from hvdsketch.compress.efsignsgd import EFSignSGD
from hvdsketch.compress.powersgd import PowerSGD
from hvdsketch.compress.qsgd import QSGD
from hvdsketch.compress.randomk import RandomK
from hvdsketch.compress.sketch import SparseSketch
from hvdsketch.compress.support import Layout, RowSparse
from hvdsketch.compress.terngrad import TernGrad
from hvdsketch.compress.topk import TopK
from hvdsketch.compress.union import Union

REGISTRY: dict[str, type[Compressor]] = {
    cls.name: cls for cls in (NoCompression, HalfPrecision, SparseSketch, Union, Allgather, Balanced,
                              TopK, RandomK, DeepGradientCompression, QSGD, TernGrad, EFSignSGD, PowerSGD)
}


def create(flag: "str | _spec.Spec | Compressor", **options) -> Compressor:
    """The compressor a flag names (``"sketch:rows=3"``, or ``"sketch", rows=3``), its options
    validated; raises :class:`hvdsketch.spec.SpecError` naming the valid choices."""
    if isinstance(flag, Compressor):
        return flag
    return _spec.build(flag, REGISTRY, **options)


__all__ = ["Compressor", "Layout", "Message", "Round", "TensorContext", "RowSparse", "REGISTRY", "create"]
