"""``fasttext``: a fastText-style text classifier whose gradient is almost all sparse (PyTorch).

Joulin et al. (2017), "Bag of Tricks for Efficient Text Classification": a
document is the mean of the embeddings of its words and of its hashed word
bigrams (the hashing trick keeps the bigram table at a fixed ``buckets`` rows),
followed by one linear layer. The task (:func:`hvdsketch.lab.workloads.corpora.wordnet`):
given a WordNet synset's words and gloss, name its lexicographer file, one
of 45 supersenses (``noun.animal``, ``verb.motion``, ...).

The embedding table has ``vocab_size + buckets`` rows (161,072 x 64 = 10.3M
parameters by default); a batch of 64 synsets touches about 1,300 of them, so
over 99% of the model's gradient is a sparse COO tensor of those rows
(``nn.EmbeddingBag(sparse=True)``); only the small output layer is dense.
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


class FastTextModel(nn.Module):
    def __init__(self, rows: int, embed_dim: int, classes: int, sparse: bool) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(rows, embed_dim, mode="mean", sparse=sparse)
        self.classifier = nn.Linear(embed_dim, classes)
        nn.init.uniform_(self.embedding.weight, -1 / embed_dim, 1 / embed_dim)  # fastText's initialisation

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Class logits for the bags ``ids[offsets[i]:offsets[i + 1]]``."""
        return self.classifier(self.embedding(ids, offsets))


@dataclass(frozen=True)
class FastTextClassifier(TorchWorkload):
    """vocab_size  most frequent training words, ``<unk>`` included
    buckets     rows of the hashed-bigram table
    embed_dim   embedding width
    sparse      the embedding's gradient as a sparse COO tensor of the rows used
    """

    name = "fasttext"
    metric: ClassVar[str] = "accuracy"
    higher_is_better: ClassVar[bool] = True

    batch_size: int = 64
    eval_batch_size: int = 1024
    vocab_size: int = 30000
    buckets: int = 2**17
    embed_dim: int = 64
    sparse: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for option in ("vocab_size", "buckets", "embed_dim"):
            if getattr(self, option) < 1:
                raise ValueError(f"{option} must be >= 1, got {getattr(self, option)}")

    @functools.cached_property
    def corpus(self) -> dict[str, np.ndarray]:
        return corpora.wordnet(self.vocab_size, self.buckets)

    def examples(self, split: Split) -> int:
        return len(self.corpus[f"{split}_labels"])

    def arrays(self, split: Split, index: np.ndarray) -> tuple[np.ndarray, ...]:
        ids, offsets = self.corpus[f"{split}_ids"], self.corpus[f"{split}_offsets"]
        starts, ends = offsets[index], offsets[index + 1]
        bags = np.concatenate([ids[s:e] for s, e in zip(starts, ends)])
        return bags, np.concatenate([[0], np.cumsum(ends - starts)[:-1]]), self.corpus[f"{split}_labels"][index]

    def make_model(self) -> nn.Module:
        rows = len(self.corpus["words"]) + self.buckets
        return FastTextModel(rows, self.embed_dim, len(self.corpus["classes"]), self.sparse)

    def forward(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        ids, offsets, labels = batch
        return model(ids, offsets), labels
