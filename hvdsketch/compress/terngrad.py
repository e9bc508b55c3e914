"""TernGrad: stochastic ternary gradients {-1, 0, 1} * max|g| (Wen et al., NeurIPS 2017)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from hvdsketch.compress.quantize import StochasticQuantizer
from hvdsketch.ops.contract import Ops


@dataclass(frozen=True)
class TernGrad(StochasticQuantizer):
    """Each tensor ``g`` is sent as ``s_t = ||g||_inf`` and ternary codes ``sign(g) ∘ b`` (Sec. 3)::

        ternarize(g) = s_t * sign(g) ∘ b,   s_t = max_k |g_k|,   P(b_k = 1) = |g_k| / s_t

    unbiased: stochastic rounding with one level (:mod:`hvdsketch.compress.quantize`). Codes travel as int8 and
    ``s_t`` in the tensor's dtype, both allgathered; each rank sends its own ``s_t`` (no scaler sharing).

    Host syncs: none.

    Options (flag ``terngrad``):
      seed    base seed of the rounding draws (default 0)
    """

    name: ClassVar[str] = "terngrad"
    levels: ClassVar[int] = 1
    bucket: ClassVar[None] = None

    seed: int = 0

    def scales(self, ops: Ops, flat: Any, size: int) -> Any:
        return ops.bucket_norms(flat, size, math.inf)
