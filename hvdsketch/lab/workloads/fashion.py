"""``fashion``: a small CNN on Fashion-MNIST, the dense-gradient workload (PyTorch).

Every weight takes part in every example, so every gradient is dense: the
case where a sparse compressor must recognise that a sketch saves nothing
and send the tensor as it is. The network is LeNet-like: two 5x5
convolutions with ReLU and 2x2 max-pooling (28 -> 14 -> 7), then two fully
connected layers; the first of these holds most of the parameters
(``channels[1] * 49 x hidden``). Images are scaled to [0, 1] and
standardised with the training set's mean and deviation.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from hvdsketch.lab.workloads import corpora
from hvdsketch.lab.workloads.base import Batch, Split
from hvdsketch.lab.workloads.torchbase import TorchWorkload


def cnn(conv1: int, conv2: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, conv1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(conv1, conv2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(conv2 * 7 * 7, hidden), nn.ReLU(), nn.Linear(hidden, classes),
    )


@dataclass(frozen=True)
class FashionCNN(TorchWorkload):
    """conv1, conv2  channels of the two convolutions
    hidden        width of the hidden fully connected layer
    """

    name = "fashion"
    metric: ClassVar[str] = "accuracy"
    higher_is_better: ClassVar[bool] = True

    batch_size: int = 64
    eval_batch_size: int = 1000
    conv1: int = 16
    conv2: int = 32
    hidden: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        for option in ("conv1", "conv2", "hidden"):
            if getattr(self, option) < 1:
                raise ValueError(f"{option} must be >= 1, got {getattr(self, option)}")

    @functools.cached_property
    def corpus(self) -> dict[str, np.ndarray]:
        return corpora.fashion()

    def examples(self, split: Split) -> int:
        return len(self.corpus[f"{split}_labels"])

    def arrays(self, split: Split, index: np.ndarray) -> tuple[np.ndarray, ...]:
        images = self.corpus[f"{split}_images"][index].astype(np.float32) / 255
        images = (images - self.corpus["mean"].astype(np.float32)) / self.corpus["std"].astype(np.float32)
        return images[:, None], self.corpus[f"{split}_labels"][index].astype(np.int64)

    def make_model(self) -> nn.Module:
        return cnn(self.conv1, self.conv2, self.hidden, len(corpora.FASHION_CLASSES))

    def forward(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = batch
        return model(images), labels
