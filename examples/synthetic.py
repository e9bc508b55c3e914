"""Synthetic data for the example scripts (no downloads): short documents of word ids and a class.

A document is ``length`` word ids drawn from the ``common`` most frequent of a vocabulary of
``vocab`` words, and its class is its first word's id modulo ``classes``: a task a bag-of-words
model learns in a few dozen steps, whose embedding gradient touches few rows of a large table (the
case the sparse-sketch is made for). Each rank draws its own documents.
"""
import numpy as np

VOCAB = 5000


def documents(rank: int, count: int = 512, length: int = 6, common: int = 200, classes: int = 4,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(words, labels)``: int64 ``[count, length]`` word ids and int64 ``[count]`` classes."""
    rng = np.random.default_rng([seed, rank])
    words = rng.integers(0, common, size=(count, length))
    return words, words[:, 0] % classes
