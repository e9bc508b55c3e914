"""hvdsketch for PyTorch.

One-line change to a Horovod script::

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvdsketch.torch.Compression.sketch(error=0.5))

or hvdsketch's own optimizer, which knows tensor names and steps, runs
multi-round compressors (PowerSGD), error feedback, and reports bytes::

    optimizer = hvdsketch.torch.DistributedOptimizer(optimizer, model.named_parameters(),
                                                     compression="sketch:error=0.5")
"""
from hvdsketch.torch.compression import Compression
from hvdsketch.torch.functions import broadcast_optimizer_state
from hvdsketch.torch.optimizer import DistributedOptimizer

__all__ = ["Compression", "DistributedOptimizer", "broadcast_optimizer_state"]
