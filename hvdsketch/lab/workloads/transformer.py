"""``transformer``: a small transformer language model with untied embeddings (PyTorch), for FSDP2.

The LSTM's data (:mod:`hvdsketch.lab.workloads.language`: the King James Bible, BPTT windows, a
vocabulary of ``vocab_size`` words) through a decoder-only transformer: token embedding plus a learnt
position embedding -> ``layers`` pre-norm blocks (causal self-attention, a ``4 x`` MLP) -> a final
norm -> an untied linear head over the vocabulary. A batch of 20 windows of 35 words touches a few
hundred of the 10,000 embedding rows, so the embedding's gradient (dense under FSDP) is mostly zero
rows, while the head's gets a gradient in every row through the softmax. :meth:`shard` wraps it as
FSDP2 users do: ``fully_shard`` on the embedding, on each block and on the model (the head, the
position embedding and the final norm stay with the root).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hvdsketch.lab.workloads.base import Batch
from hvdsketch.lab.workloads.language import LanguageModelData
from hvdsketch.lab.workloads.torchbase import TorchWorkload


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, each added to the residual stream."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TransformerModel(nn.Module):
    def __init__(self, vocabulary: int, width: int, context: int, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.decoder = nn.Linear(width, vocabulary)
        nn.init.normal_(self.embedding.weight, std=0.02)
        nn.init.normal_(self.position, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-word logits ``(batch, time, vocabulary)`` for ``tokens`` ``(batch, time)``."""
        x = self.drop(self.embedding(tokens) + self.position[:tokens.shape[1]])
        for block in self.blocks:
            x = block(x)
        return self.decoder(self.norm(x))


@dataclass(frozen=True)
class TransformerLanguageModel(LanguageModelData, TorchWorkload):
    """heads  attention heads per block (``embed_dim`` a multiple of it); ``hidden`` is not used"""

    name = "transformer"
    embed_dim: int = 128
    heads: int = 4
    dropout: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tied:
            raise ValueError("the transformer's head is untied from its embedding (tied=false)")
        if self.heads < 1 or self.embed_dim % self.heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be a multiple of heads ({self.heads})")

    def make_model(self) -> nn.Module:
        return TransformerModel(self.vocabulary, self.embed_dim, self.bptt, self.layers, self.heads, self.dropout)

    def forward(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = batch
        return model(inputs), targets

    @staticmethod
    def shard(model: nn.Module, **options: Any) -> nn.Module:
        """``model`` under FSDP2 as its users shard it: the embedding, each block, then the model
        (``options``: ``fully_shard``'s, e.g. ``mp_policy``, ``reshard_after_forward``)."""
        from torch.distributed.fsdp import fully_shard

        for part in (model.embedding, *model.blocks):
            fully_shard(part, **options)
        return fully_shard(model, **options)
