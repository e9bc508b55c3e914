"""hvdsketch for FSDP2 (``torch.distributed.fsdp.fully_shard``): a compressed reduce-scatter, and HSDP's replica all-reduce.

One line added after ``fully_shard``::

    import hvdsketch.torch.fsdp

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    reduction = hvdsketch.torch.fsdp.compress(model, compression="auto")   # the one line

Every ``FSDPModule`` of the model (the model itself included) then reduces its gradients through
hvdsketch's exchanger (``FSDPModule.set_custom_reduce_scatter``, PyTorch >= 2.9). FSDP's reduction is
one reduce-scatter per module: every rank gives the chunk-cat of the module's gradients, rank ``q``'s
shard of every parameter at block ``q``, and gets the average of its own block. The methods
(:mod:`hvdsketch.compress.scatter`), with the flag grammar of every hvdsketch front end:

- ``none``: FSDP's own reduce-scatter, bit for bit;
- ``fp16`` (``fp16:dtype=bfloat16``): every block cast to 16 bits and sent to its owner in one
  all-to-all, summed there in float32: half the bytes of a float32 reduction, and closer to the exact
  average than FSDP's own 16-bit reduction (``MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)``),
  which rounds its partial sums to 16 bits;
- ``quantize`` (``quantize:bits=8,block=256``; ``bits=4``): integers with a float32 scale per block of
  elements, the sender's rounding kept as its residual and added to its next step's gradient (error
  feedback; float32 residuals, or those of ``memory=``, e.g. ``"plan:budget=0.25"``);
- ``rows``: only the non-zero rows of each block (an embedding's touched rows) and their indices,
  sent to the block's owner; exact;
- ``auto``: each module's method priced from the link (``auto:bandwidth=1gbit,latency=1ms`` declares
  it instead of probing), after a few steps of FSDP's own reduce-scatter.

``compression`` defaults to ``HVDSKETCH_COMPRESSION``, then ``"none"``. hvdsketch owns the average:
``compress`` sets every module's ``set_gradient_divide_factor(1.0)`` and
``set_force_sum_reduction_for_comms(True)``, so FSDP scales nothing itself.

HSDP: give ``fully_shard`` the shard dimension of a 2-D mesh and hvdsketch its replicas; each
module's reduced block is then averaged across the replicas through the ordinary exchange (the flags
of the DDP hook: ``fp16``, ``powersgd``, the exact sparse methods, ``auto``), in FSDP's all-reduce hook
(``FSDPModule.set_all_reduce_hook``)::

    mesh = init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))
    fully_shard(model, mesh=mesh["shard"])
    hvdsketch.torch.fsdp.compress(model, "fp16:dtype=bfloat16", replicate=mesh["replicate"],
                                  replicate_compression="powersgd")

A step is one backward: each module's exchange completes in FSDP's call (FSDP reads its block when the
call returns), and the end of backward ends the step (every result checked finite on every rank, the
policy's decisions). The first step checks that every rank runs the same setup; :func:`compress` checks
first, on every rank, that all run the same PyTorch, model and arguments: a difference is the same
clear error on every rank, never a hang. Custom reduce-scatters take one parameter group per module
(no ``shard_placement_fn`` giving parameters other meshes) and no ``set_symm_mem_for_comm``; FSDP's
reduce-scatter layout must stay fixed (parameters without a gradient in a step change it:
``module.set_reduce_scatter_unused_params(True)`` keeps it).
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
            see :mod:`hvdsketch.torch.fsdp`), a reduce-scatter method or a policy.
        memory: error feedback: a ``--memory`` flag (``"fp32"``, ``"plan:budget=0.25"``) or a
            :class:`hvdsketch.memory.Memory`; ``None``: float32 residuals for the methods whose error
            feedback is part of them (``quantize``), none for the others.
        options: ``replicate`` (HSDP: the replicas' process group or 1-D ``DeviceMesh``),
            ``replicate_compression`` and ``replicate_memory`` (the replica all-reduce's flags, as
            :class:`hvdsketch.torch.ddp.ExchangeState` takes), ``error_if_nonfinite`` (``False``, the default: a NaN
            or Inf average is handed back for a loss scaler to skip the step, hvdsketch's state kept as
            before it; ``True``: an error on every rank) and ``prefix``.

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
