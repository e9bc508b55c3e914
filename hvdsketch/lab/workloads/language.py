"""Word-level language modelling on the King James Bible, framework-free: options and BPTT windows.

The token stream of each split (:func:`hvdsketch.lab.workloads.corpora.kjv`) is
cut into windows of ``bptt + 1`` tokens starting every ``bptt`` tokens; a
window's first ``bptt`` tokens are the input and its last ``bptt`` the
targets, so every token of the split is a target exactly once. Windows are
independent examples (the recurrent state starts at zero in each), which lets
data-parallel ranks shuffle and shard them like any other examples; the
price is a somewhat higher perplexity than carrying the state across windows
(truncated BPTT over a continuous stream, Zaremba et al. 2014).

Validation perplexity is ``exp`` of the mean cross-entropy per target word
(nats), over every window of the held-out chapters.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from hvdsketch.lab.workloads import corpora
from hvdsketch.lab.workloads.base import Split, Workload


@dataclass(frozen=True)
class LanguageModelData(Workload):
    """A 2-layer LSTM language model's options (the PyTorch and the tf-keras model share them).

    vocab_size  the most frequent words of the training split, ``<unk>`` included (KJV has ~12.9k)
    bptt        tokens per window (backpropagation through time)
    embed_dim   input embedding width
    hidden      LSTM width
    layers      stacked LSTM layers
    dropout     on the embedding output, between LSTM layers and on the LSTM output
    tied        share the decoder's weight with the embedding (needs embed_dim == hidden)
    """

    metric: ClassVar[str] = "perplexity"
    higher_is_better: ClassVar[bool] = False

    batch_size: int = 20
    eval_batch_size: int = 64
    vocab_size: int = 10000
    bptt: int = 35
    embed_dim: int = 256
    hidden: int = 256
    layers: int = 2
    dropout: float = 0.2
    tied: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        for option in ("vocab_size", "bptt", "embed_dim", "hidden", "layers"):
            if getattr(self, option) < 1:
                raise ValueError(f"{option} must be >= 1, got {getattr(self, option)}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.tied and self.embed_dim != self.hidden:
            raise ValueError(f"tied=true needs embed_dim == hidden, got {self.embed_dim} and {self.hidden}")

    @functools.cached_property
    def corpus(self) -> dict[str, np.ndarray]:
        return corpora.kjv(self.vocab_size)

    @property
    def vocabulary(self) -> int:
        """Rows of the embedding: ``vocab_size``, or fewer if the corpus has fewer words."""
        return len(self.corpus["words"])

    def windows(self, split: Split) -> np.ndarray:
        """A read-only ``(n, bptt + 1)`` view of the split's stream, one row per window."""
        stream = self.corpus[split]
        return np.lib.stride_tricks.sliding_window_view(stream, self.bptt + 1)[:: self.bptt]

    def examples(self, split: Split) -> int:
        return len(self.windows(split))

    def arrays(self, split: Split, index: np.ndarray) -> tuple[np.ndarray, ...]:
        window = self.windows(split)[index].astype(np.int64)
        return window[:, :-1], window[:, 1:]

    def evaluate(self, model: Any) -> dict[str, float]:
        metrics = super().evaluate(model)
        return {**metrics, "perplexity": math.exp(metrics["loss"])}
