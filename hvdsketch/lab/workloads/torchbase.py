"""The PyTorch side of a workload: tensors for batches, seeded models, cross-entropy loss and scores.

Every PyTorch workload here is a classifier in the broad sense: ``forward``
returns logits whose last dimension ranges over classes (next words, lexicographer
files, kinds of clothing) and integer targets of the remaining shape.
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hvdsketch.lab.workloads.base import Batch, Workload


@dataclass(frozen=True)
class TorchWorkload(Workload):
    framework: ClassVar[str] = "torch"

    @abstractmethod
    def make_model(self) -> nn.Module:
        """The model, built under the caller's random state."""

    @abstractmethod
    def forward(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits, targets)`` of a batch."""

    def to_batch(self, arrays: tuple[np.ndarray, ...]) -> Batch:
        return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)

    def build_model(self) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self.make_model()

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        logits, targets = self.forward(model, batch)
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten())

    def score(self, model: nn.Module, batch: Batch) -> tuple[float, int, int]:
        logits, targets = self.forward(model, batch)
        total = F.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction="sum")
        return float(total), int((logits.argmax(-1) == targets).sum()), targets.numel()

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """As :meth:`Workload.evaluate`, in eval mode (no dropout) without autograd; the mode is restored."""
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return super().evaluate(model)
        finally:
            model.train(was_training)
