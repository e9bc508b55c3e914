"""What every workload is: real data with a fixed split, a model, a loss and a quality metric.

A workload's data are *examples* (BPTT windows, documents, images) numbered
``0 .. n-1`` per split. The base class turns them into batches:

- ``train_batches(epoch, rank, size)``: this rank's share of the epoch
  (:func:`hvdsketch.lab.workloads.data.shard`): the same number of steps on every
  rank, disjoint batches that together cover the training set once;
- ``val_batches()``: the whole validation split in order, alike on every rank;
- ``evaluate(model)``: mean cross-entropy and accuracy over the validation
  split (language models add perplexity, ``exp`` of the mean loss).

Subclasses supply the data hooks (``examples``, ``arrays``) in numpy, and a
framework's adapter (:mod:`hvdsketch.lab.workloads.torchbase`, or the tf-keras
module) supplies ``to_batch``, ``build_model``, ``loss`` and ``score``. The
fields of a workload's frozen dataclass are its options
(``hvdsketch.lab.workloads.get("lstm:bptt=20")``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Literal

import numpy as np

from hvdsketch.lab.workloads.data import shard

Split = Literal["train", "val"]
Batch = tuple[Any, ...]


@dataclass(frozen=True)
class Workload(ABC):
    """Options every workload has.

    batch_size       examples per rank and step (the global batch is ``size`` times this)
    eval_batch_size  examples per validation batch
    limit            train on the first ``limit`` training examples only (quick runs); None: all
    val_limit        validate on the first ``val_limit`` validation examples only (frequent
                     validation in long runs); None: all
    seed             seeds the model's initial weights and each epoch's shuffle
    """

    name: ClassVar[str]
    framework: ClassVar[str]  # "torch" or "tensorflow": which training loop and Horovod module it needs
    metric: ClassVar[str]  # the headline key of evaluate()
    higher_is_better: ClassVar[bool]

    batch_size: int = 32
    eval_batch_size: int = 256
    limit: int | None = None
    val_limit: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for option in ("batch_size", "eval_batch_size"):
            if getattr(self, option) < 1:
                raise ValueError(f"{option} must be >= 1, got {getattr(self, option)}")
        for option in ("limit", "val_limit"):
            if getattr(self, option) is not None and getattr(self, option) < 1:
                raise ValueError(f"{option} must be >= 1 or None, got {getattr(self, option)}")

    # -- data hooks (numpy) -------------------------------------------------
    @abstractmethod
    def examples(self, split: Split) -> int:
        """How many examples the split holds."""

    @abstractmethod
    def arrays(self, split: Split, index: np.ndarray) -> tuple[np.ndarray, ...]:
        """The numpy arrays of one batch made of the examples ``index``."""

    # -- framework hooks ----------------------------------------------------
    @abstractmethod
    def to_batch(self, arrays: tuple[np.ndarray, ...]) -> Batch:
        """Numpy arrays as the framework's batch."""

    @abstractmethod
    def build_model(self) -> Any:
        """A freshly initialised model, equal on every rank (weights seeded by ``seed``)."""

    @abstractmethod
    def loss(self, model: Any, batch: Batch) -> Any:
        """The mean training loss of ``batch`` (a differentiable scalar, model in training mode)."""

    @abstractmethod
    def score(self, model: Any, batch: Batch) -> tuple[float, int, int]:
        """For a validation batch in inference mode: (summed cross-entropy, correct predictions, targets)."""

    # -- provided -----------------------------------------------------------
    def train_examples(self) -> int:
        n = self.examples("train")
        return n if self.limit is None else min(n, self.limit)

    def steps_per_epoch(self, size: int = 1) -> int:
        return self.train_examples() // (self.batch_size * size)

    def train_batches(self, epoch: int, rank: int = 0, size: int = 1) -> Iterator[Batch]:
        """Rank ``rank`` of ``size``'s batches of ``epoch``, shuffled by ``(seed, epoch)``."""
        for index in shard(self.train_examples(), self.batch_size, epoch, self.seed, rank, size):
            yield self.to_batch(self.arrays("train", index))

    def val_batches(self) -> Iterator[Batch]:
        n = self.examples("val") if self.val_limit is None else min(self.examples("val"), self.val_limit)
        for start in range(0, n, self.eval_batch_size):
            yield self.to_batch(self.arrays("val", np.arange(start, min(start + self.eval_batch_size, n))))

    def evaluate(self, model: Any) -> dict[str, float]:
        """``loss`` (mean cross-entropy per target) and ``accuracy`` over the validation split."""
        total = correct = count = 0
        for batch in self.val_batches():
            s, c, n = self.score(model, batch)
            total, correct, count = total + s, correct + c, count + n
        return {"loss": total / count, "accuracy": correct / count}

