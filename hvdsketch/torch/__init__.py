"""hvdsketch for PyTorch.

One-line change to a Horovod script::

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvdsketch.torch.Compression.sketch(error=0.5))

or hvdsketch's own optimizer, which knows tensor names and steps, runs
multi-round compressors (PowerSGD), error feedback, and reports bytes::

    optimizer = hvdsketch.torch.DistributedOptimizer(optimizer, model.named_parameters(),
                                                     compression="sketch:error=0.5")

Its ``state_dict()`` gathers every rank's state (a collective call): rank 0 saves one file,
and every rank loads it, or rank 0 loads it and :func:`broadcast_optimizer_state` (in place
of Horovod's) gives every rank its own state. Horovod elastic's ``TorchState`` works as is
(:mod:`hvdsketch.torch.elastic`).
"""
from hvdsketch.torch.compression import Compression
from hvdsketch.torch.functions import broadcast_optimizer_state
from hvdsketch.torch.optimizer import DistributedOptimizer

__all__ = ["Compression", "DistributedOptimizer", "broadcast_optimizer_state"]
