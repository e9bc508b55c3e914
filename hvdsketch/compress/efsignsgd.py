"""EF-SignSGD: scaled signs with error feedback (Karimireddy et al., ICML 2019)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from hvdsketch.compress.base import Compressor, Message, TensorContext
from hvdsketch.compress.support import flat_out
from hvdsketch.ops import backend


@dataclass(frozen=True)
class EFSignSGD(Compressor):
    """Send ``C(p) = (||p||_1 / d) sign(p)`` of the error-compensated ``p`` (Algorithm 1, EF-SIGNSGD)::

        p_t = g_t + e_t,   Δ_t = (||p_t||_1 / d) sign(p_t),   e_{t+1} = p_t - Δ_t

    Error feedback is part of the method (``feedback``). Signs travel as bits, 8 per byte (``sign(0)`` sent as +),
    the scale as one value of the tensor's dtype; both are allgathered and every rank averages all ranks' ``C(p)``.

    Host syncs: none.

    Options (flag ``efsignsgd``): none.
    """

    name: ClassVar[str] = "efsignsgd"
    overflows: ClassVar[bool] = True
    feedback: ClassVar[bool] = True

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        ops = backend(tensor)
        flat = ops.flatten(tensor)
        n = math.prod(ctx.shape)
        scale = ops.bucket_norms(flat, n, 1) / n
        return [Message(scale, "allgather"), Message(ops.sign_bits(flat), "allgather")], None

    def decompress(self, reduced: Sequence[Any], state: Any, ctx: TensorContext) -> Any:
        """The mean over ranks of ``scale * (2 bit - 1)``, the ``1 / N`` folded into the scales."""
        scales, bits = reduced
        ops = backend(scales)
        n = math.prod(ctx.shape)
        average = ops.sign_sum(ops.reshape(bits, (ctx.world_size, -1)), ops.reshape(scales / ctx.world_size, (-1,)), n,
                               flat_out(ops, ctx.out))
        return ops.reshape(average, ctx.shape)
