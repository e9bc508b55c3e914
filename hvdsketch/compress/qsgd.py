"""QSGD: stochastic quantization to s levels of ``|v| / ||v||_2`` (Alistarh et al., NeurIPS 2017)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hvdsketch.compress.quantize import StochasticQuantizer
from hvdsketch.ops.contract import Ops


@dataclass(frozen=True)
class QSGD(StochasticQuantizer):
    """Each bucket ``v`` of ``bucket`` coordinates is sent as ``||v||_2`` and ``sgn(v_i) xi_i`` (Sec. 3.1)::

        Q_s(v_i) = ||v||_2 * sgn(v_i) * xi_i(v, s),
        xi_i = (l + 1) / s with probability s |v_i| / ||v||_2 - l, else l / s,   l = floor(s |v_i| / ||v||_2)

    unbiased, with variance ``E||Q_s(v) - v||^2 <= min(B / s^2, sqrt(B) / s) ||v||^2`` for buckets of ``B``
    (Lemma 3.1). ``s * xi_i`` travels as int8 (int16 for ``levels > 127``), the norms in the tensor's dtype, both
    allgathered (:mod:`hvdsketch.compress.quantize`).

    Host syncs: none.

    Options (flag ``qsgd:levels=127,bucket=512``):
      levels  quantization levels s per sign, 1..32767 (default 127: 8-bit codes)
      bucket  coordinates per norm; none for one norm per tensor (default 512)
      seed    base seed of the rounding draws (default 0)
    """

    name: ClassVar[str] = "qsgd"

    levels: int = 127
    bucket: int | None = 512
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.levels <= 32767:
            raise ValueError(f"levels must be in 1..32767, got {self.levels}")
        if self.bucket is not None and self.bucket < 1:
            raise ValueError(f"bucket must be >= 1 or none, got {self.bucket}")

    def scales(self, ops: Ops, flat: Any, size: int) -> Any:
        return ops.bucket_norms(flat, size, 2)
