"""A front end's exchanger, made from the user's flags: policy, residual memory, communicator.

Every front end over ``torch.distributed`` (the DDP hook, FSDP's reduce-scatter and its replica
all-reduce) makes its :class:`~hvdsketch.exchange.Exchanger` here, from what the user wrote
(``compression=``, ``memory=``) and the communicator it chose, so none of them assembles the engine
by itself.
"""
from __future__ import annotations

from typing import Any

from hvdsketch.collectives import Communicator
from hvdsketch.exchange.exchanger import Exchanger


def assemble(compression: Any, memory: Any, communicator: Communicator, scatter: bool = False,
             **options: Any) -> Exchanger:
    """The exchanger of ``compression`` (a flag, rules, a compressor or a policy, as
    :func:`hvdsketch.policy.create` takes) and ``memory`` (a ``--memory`` flag, a
    :class:`~hvdsketch.memory.Memory`, or ``None`` for no error feedback) over ``communicator``.

    Args:
        scatter: its exchanges are reduce-scatters (FSDP's), each rank's result its block of the
            average: ``compression`` names a reduce-scatter method or ``auto`` over them
            (:func:`hvdsketch.policy.scatter.create`).
        options: the :class:`~hvdsketch.exchange.Exchanger`'s own (``prefix``, ``error_if_nonfinite``, ...).

    Raises :class:`hvdsketch.spec.SpecError` for a flag that names nothing valid.

    Example::

        exchanger = assemble("topk:ratio=0.01", "fp32", TorchDistCommunicator(), prefix="hvdsketch.ddp")
    """
    from hvdsketch.memory import create as create_memory
    from hvdsketch.policy import create as create_policy
    from hvdsketch.policy.scatter import create as create_scatter_policy

    policy = (create_scatter_policy if scatter else create_policy)(compression)
    return Exchanger(policy, communicator, None if memory is None else create_memory(memory), **options)
