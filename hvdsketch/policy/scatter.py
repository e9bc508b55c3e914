"""The policies of a reduce-scatter (FSDP's gradient reduction): one method for every module, or ``auto``.

What ``compression=`` of :func:`hvdsketch.torch.fsdp.compress` accepts: a reduce-scatter method's flag
(:mod:`hvdsketch.compress.scatter`) as a :class:`~hvdsketch.policy.base.Fixed` policy, ``auto[:...]``
(:class:`ScatterAutoPolicy`), or a policy object as it is.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Sequence

from hvdsketch import spec as _spec
from hvdsketch.compress import Compressor, TensorContext, scatter
from hvdsketch.policy.auto import AutoOptions, AutoPolicy
from hvdsketch.policy.base import Fixed, Policy
from hvdsketch.policy.cost import Measurement, measure


class ScatterAutoPolicy(AutoPolicy):
    """``auto`` for a reduce-scatter: each FSDP module's method priced as :class:`AutoPolicy` prices an
    allreduce's, among ``none`` (FSDP's own, to beat by ``margin``), ``fp16:dtype=bfloat16`` (float32 and float64
    gradients), ``quantize`` (8 bits, residuals fed back) and ``rows`` (where some rows are zero on every rank).
    Modules share no collective: each module's exchange completes before the next one's starts.
    """

    create: ClassVar[Callable[[str], Compressor]] = staticmethod(scatter.create)
    rows_flag: ClassVar[str] = "none"  # FSDP's gradients come dense

    def candidates(self, shape: Sequence[int], dtype: str, element: float, union: float,
                   traced: bool = False, row_sparse: bool = False) -> list[Compressor]:
        found = [self._none]
        if dtype in ("float32", "float64"):
            found.append(self.create("fp16:dtype=bfloat16"))
        found.append(self.create("quantize"))
        if union < 1:
            found.append(self.create("rows"))
        return found

    def _measure(self, compressor: Compressor, tensor: Any, ctx: TensorContext, union: float,
                 touched: float | None = None, ring_bor: bool = False) -> Measurement:
        """The candidate run on this rank's tensor (its alltoalls priced at the ``(N - 1) / N`` of
        their messages that leave the rank), its collectives its own (named by the tensor)."""
        measured = measure(compressor, tensor, ctx)
        return dataclasses.replace(measured, collectives=frozenset((ctx.name, *key) for key in measured.collectives))


def create(compression: Any = None) -> Policy:
    """The reduce-scatter policy ``compression`` names; ``None`` falls back to ``HVDSKETCH_COMPRESSION``, then
    ``"none"``. Raises :class:`hvdsketch.spec.SpecError` naming the valid choices."""
    if isinstance(compression, Policy):
        return compression
    if isinstance(compression, Compressor):
        return Fixed(scatter.create(compression))
    if compression is not None and not isinstance(compression, str):
        raise _spec.SpecError(f"compression of a reduce-scatter must be a flag ({', '.join(sorted(scatter.REGISTRY))} "
                              f"or auto), a reduce-scatter method or a policy, got {type(compression).__name__}")
    flag = str(_spec.resolve(compression))
    if _spec.Spec.parse(flag).name == AutoOptions.name:
        return ScatterAutoPolicy(flag)
    return Fixed(scatter.create(flag))
