"""hvdsketch for PyTorch: drop-in ``compression=`` values for Horovod's optimizer, or hvdsketch's own.

One-line change to a Horovod script::

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvdsketch.torch.Compression.sketch(error=0.5))

:func:`DistributedOptimizer` in its place knows tensor names and steps, runs multi-round compressors
(PowerSGD) and error feedback, and reports bytes; its checkpoints carry every rank's state (restore on rank 0
with :func:`broadcast_optimizer_state`). Horovod elastic: :mod:`hvdsketch.torch.elastic`.
"""
from hvdsketch.torch.compression import Compression
from hvdsketch.torch.functions import broadcast_optimizer_state
from hvdsketch.torch.optimizer import DistributedOptimizer

__all__ = ["Compression", "DistributedOptimizer", "broadcast_optimizer_state"]
