"""``lstm``: a word-level LSTM language model with a large input embedding (PyTorch).

The sparse-sketch paper's kind of workload: a step touches only the
embedding rows of the words in its batch (20 x 35 tokens hit a few hundred of
10,000 rows), so with ``sparse=True`` the embedding's gradient is a sparse
COO tensor of those rows, while the LSTM's and the untied decoder's
gradients are dense (the decoder's ``vocab x hidden`` matrix gets a
gradient in every row through the softmax).

Shape, as in Zaremba et al. (2014): embedding -> dropout -> LSTM x ``layers``
(dropout between) -> dropout -> linear decoder over the vocabulary; the
embedding and decoder start uniform in [-0.1, 0.1].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hvdsketch.lab.workloads.base import Batch
from hvdsketch.lab.workloads.language import LanguageModelData
from hvdsketch.lab.workloads.torchbase import TorchWorkload


class LSTMModel(nn.Module):
    def __init__(self, vocabulary: int, embed_dim: int, hidden: int, layers: int, dropout: float,
                 tied: bool, sparse: bool) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, embed_dim, sparse=sparse)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(embed_dim, hidden, layers, dropout=dropout if layers > 1 else 0.0, batch_first=True)
        self.decoder = nn.Linear(hidden, vocabulary)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if tied:
            self.decoder.weight = self.embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-word logits ``(batch, time, vocabulary)`` for ``tokens`` ``(batch, time)``."""
        output, _ = self.lstm(self.drop(self.embedding(tokens)))
        return self.decoder(self.drop(output))


@dataclass(frozen=True)
class LSTMLanguageModel(LanguageModelData, TorchWorkload):
    """sparse  the embedding's gradient as a sparse COO tensor of the rows used (``nn.Embedding(sparse=True)``)"""

    name = "lstm"
    sparse: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tied and self.sparse:
            raise ValueError("tied=true gives the embedding a dense gradient from the decoder; set sparse=false")

    def make_model(self) -> nn.Module:
        return LSTMModel(self.vocabulary, self.embed_dim, self.hidden, self.layers, self.dropout,
                         self.tied, self.sparse)

    def forward(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = batch
        return model(inputs), targets
