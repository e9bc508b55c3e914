"""hvdsketch for FSDP2 (``fully_shard``): a compressed reduce-scatter, and HSDP's replica all-reduce.

One line added after ``fully_shard``::

    import hvdsketch.torch.fsdp

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    reduction = hvdsketch.torch.fsdp.compress(model, compression="auto")   # the one line

Every ``FSDPModule`` of the model then reduce-scatters its gradients through hvdsketch
(``FSDPModule.set_custom_reduce_scatter``, PyTorch >= 2.9), by a method of :mod:`hvdsketch.compress.scatter`:

- ``none``: FSDP's own reduce-scatter, bit for bit;
- ``fp16`` (``fp16:dtype=bfloat16``): 16-bit blocks in one all-to-all, summed in float32: half the bytes of a
  float32 reduction, and closer to the exact average than FSDP's own 16-bit ``reduce_dtype``;
- ``quantize`` (``quantize:bits=8,block=256``; ``bits=4``): integers with a float32 scale per block, with
  error feedback (float32 residuals, or those of ``memory=``);
- ``rows``: only the non-zero rows of each block (an embedding's touched rows) and their indices; exact;
- ``auto``: each module's method priced from the link (``auto:bandwidth=1gbit,latency=1ms`` declares it).

hvdsketch owns the average: ``compress`` sets ``set_gradient_divide_factor(1.0)`` and
``set_force_sum_reduction_for_comms(True)`` on every module. HSDP: ``fully_shard(model, mesh=mesh["shard"])``
and ``compress(model, ..., replicate=mesh["replicate"], replicate_compression="powersgd")`` average each
module's block across the replicas with the DDP hook's flags, in FSDP's all-reduce hook.

Limits: one parameter group per module (no ``shard_placement_fn`` giving other meshes), no
``set_symm_mem_for_comm``, and a fixed reduce-scatter layout (``module.set_reduce_scatter_unused_params(True)``
keeps it where some parameters get no gradient in a step).
"""
from __future__ import annotations

from typing import Any

import torch

from hvdsketch.torch.fsdp.reduction import FSDPReduction

__all__ = ["FSDPReduction", "compress"]


def compress(model: torch.nn.Module, compression: Any = None, memory: Any = None, **options: Any) -> FSDPReduction:
    """Reduce every ``FSDPModule`` of ``model``'s gradients through hvdsketch (collective: call it on
    every rank, after ``fully_shard`` and before the first backward).

    Args:
        model: the model ``fully_shard`` wrapped (it and its wrapped submodules).
        compression: a reduce-scatter method's flag (``none``, ``fp16``, ``quantize``, ``rows``, ``auto``;
            see :mod:`hvdsketch.torch.fsdp`), a reduce-scatter method or a policy; falls back to
            ``HVDSKETCH_COMPRESSION``, then ``"none"``.
        memory: error feedback: a ``--memory`` flag (``"fp32"``, ``"plan:budget=0.25"``) or a
            :class:`hvdsketch.memory.Memory`; ``None``: float32 residuals for the methods whose error
            feedback is part of them (``quantize``), none for the others.
        options: ``replicate`` (HSDP: the replicas' process group or 1-D ``DeviceMesh``), ``replicate_compression``
            and ``replicate_memory`` (as :class:`hvdsketch.torch.ddp.ExchangeState` takes), ``error_if_nonfinite``
            (as :class:`~hvdsketch.torch.ddp.ExchangeState`'s) and ``prefix``.

    Returns:
        The :class:`FSDPReduction`: ``report()``, ``state_dict()`` / ``load_state_dict()``.

    Raises:
        RuntimeError: PyTorch lacks what the hooks need (it names the version), or
            ``torch.distributed`` is not initialized.
        hvdsketch.exchange.AgreementError: ranks differ in PyTorch, model or arguments (on every rank).
        hvdsketch.spec.SpecError: a flag that names no method.

    Example::

        reduction = hvdsketch.torch.fsdp.compress(model, "quantize:bits=8", memory="plan:budget=0.25")
    """
    return FSDPReduction(model, compression, memory, **options)
