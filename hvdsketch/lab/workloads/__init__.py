"""Real models on real data for ``hvdsketch train`` and the benchmarks.

===========  =====================================================  =========  ==================
name         model and data                                         gradients  quality
===========  =====================================================  =========  ==================
lstm         2-layer LSTM language model, King James Bible          sparse     perplexity
             (PyTorch; embedding rows sparse, the rest dense)       + dense
lstm_tf      the same model in tf-keras (``Embedding`` gives        sparse     perplexity
             ``tf.IndexedSlices``)                                  + dense
fasttext     fastText bag of words + hashed bigrams, WordNet        ~all       accuracy
             glosses -> 45 supersenses (PyTorch)                    sparse
fashion      small CNN, Fashion-MNIST (PyTorch)                     dense      accuracy
transformer  transformer language model, untied, King James         dense      perplexity
             Bible (PyTorch, FSDP2; embedding rows mostly 0)
===========  =====================================================  =========  ==================

``get("lstm:bptt=20,vocab_size=12000")`` (or ``get("lstm", bptt=20)``) builds
one with its options validated, through the same flag syntax as compressors
(:mod:`hvdsketch.spec`). A workload's module is imported only when asked
for, so choosing a PyTorch workload never imports TensorFlow, and no
workload imports Horovod.
"""
from __future__ import annotations

import importlib
from typing import Any, Iterator, Mapping

from hvdsketch import spec as _spec
from hvdsketch.lab.workloads.base import Workload

_MODULES = {
    "lstm": "hvdsketch.lab.workloads.lstm:LSTMLanguageModel",
    "lstm_tf": "hvdsketch.lab.workloads.lstm_tf:KerasLanguageModel",
    "fasttext": "hvdsketch.lab.workloads.fasttext:FastTextClassifier",
    "fashion": "hvdsketch.lab.workloads.fashion:FashionCNN",
    "transformer": "hvdsketch.lab.workloads.transformer:TransformerLanguageModel",
}


class _LazyRegistry(Mapping[str, type]):
    """Workload classes by name, each module imported on first lookup."""

    def __getitem__(self, name: str) -> type:
        module, _, cls = _MODULES[name].partition(":")
        return getattr(importlib.import_module(module), cls)

    def __contains__(self, name: object) -> bool:
        return name in _MODULES

    def __iter__(self) -> Iterator[str]:
        return iter(_MODULES)

    def __len__(self) -> int:
        return len(_MODULES)


REGISTRY: Mapping[str, type] = _LazyRegistry()


def get(flag: "str | _spec.Spec", **options: Any) -> Workload:
    """The workload a flag names, options validated; raises :class:`hvdsketch.spec.SpecError`
    naming the valid workloads or options."""
    return _spec.build(flag, REGISTRY, kind="workload", **options)


__all__ = ["REGISTRY", "Workload", "get"]
