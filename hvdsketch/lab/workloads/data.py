"""Framework-free data plumbing shared by every workload: cache, tokens, vocabulary, splits, shards.

- :func:`cached` stores processed arrays under ``~/.cache/hvdsketch/data``
  (``$HVDSKETCH_CACHE/data`` when set, as in ``launch/setup.sh``), keyed by a
  hash of everything that went into them: the source files' bytes, the
  processing options and :data:`FORMAT`. A second run loads an ``.npz`` in
  milliseconds; a changed source or option makes a new entry. Writes go to a
  temporary file renamed into place, so ranks that build the same entry at
  once never read a half-written file.
- :func:`tokenize` and :class:`Vocabulary`: lowercase words; the ``N - 1``
  most frequent words of the *training* split plus ``<unk>`` at id 0.
- :func:`in_validation`: a fixed split by a stable hash (CRC-32) of each
  example's natural key (a chapter, a synset), so the split never depends on
  the order the source lists things in, on a seed or on the vocabulary.
- :func:`shard`: each epoch, one permutation of the training examples seeded
  by ``(seed, epoch)`` and alike on every rank is cut into steps of
  ``size * batch`` examples; rank ``r`` takes the ``r``-th ``batch`` of every
  step. The ranks' batches are disjoint and together cover the epoch once;
  the remainder (fewer than ``size * batch`` examples) is dropped so every
  rank runs the same number of steps, hence the same collectives.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from hvdsketch.digests import crc

FORMAT = 1  # bump when the processing below changes what a cache entry holds
UNK = "<unk>"
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


class DataMissing(FileNotFoundError):
    """A workload's source data is not installed; the message names the package that ships it."""


def cache_dir() -> Path:
    root = os.environ.get("HVDSKETCH_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hvdsketch"
    return Path(root) / "data"


def file_digest(path: Path) -> str:
    """SHA-256 of a source file's bytes (part of a cache key)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def require(paths: Iterable[Path], package: str) -> None:
    """Raise :class:`DataMissing` naming the Debian ``package`` unless every path exists."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise DataMissing(f"{', '.join(missing)} not found: it comes from the Debian package {package!r}; "
                          f"run launch/setup.sh (or: apt-get install {package})")


def cached(kind: str, key: Mapping[str, Any], build: Callable[[], dict[str, np.ndarray]],
           use_cache: bool = True) -> dict[str, np.ndarray]:
    """The arrays ``build()`` makes, loaded from the cache entry for ``key`` when one exists."""
    if not use_cache:
        return build()
    digest = hashlib.sha256(json.dumps({"format": FORMAT, **key}, sort_keys=True).encode()).hexdigest()[:20]
    path = cache_dir() / f"{kind}-{digest}.npz"
    if path.exists():
        with np.load(path, allow_pickle=False) as stored:
            return {name: stored[name] for name in stored.files}
    arrays = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{kind}-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as out:
            np.savez(out, **arrays)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is readable like any other
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return arrays


def tokenize(text: str) -> list[str]:
    """Lowercase words (letters and digits, an inner apostrophe kept: ``lord's``); punctuation dropped."""
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Vocabulary:
    """``words[i]`` is the word of id ``i``; id 0 is ``<unk>``, the rest by falling frequency (ties by spelling)."""

    words: tuple[str, ...]

    @classmethod
    def build(cls, documents: Iterable[Iterable[str]], size: int) -> "Vocabulary":
        if size < 2:
            raise ValueError(f"vocabulary size must be >= 2 (<unk> and one word), got {size}")
        counts = collections.Counter(word for doc in documents for word in doc)
        counts.pop(UNK, None)
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: size - 1]
        return cls((UNK, *(word for word, _ in ranked)))

    @functools.cached_property
    def ids(self) -> dict[str, int]:
        return {word: i for i, word in enumerate(self.words)}

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        ids = self.ids
        return np.fromiter((ids.get(t, 0) for t in tokens), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.words)


def in_validation(key: str, fraction: float) -> bool:
    """Whether the example with this key is held out: CRC-32 of the key below ``fraction`` of 2^32."""
    return crc(key) < fraction * 2**32


def shard(n: int, batch: int, epoch: int, seed: int, rank: int, size: int) -> np.ndarray:
    """Example indices of rank ``rank``'s batches in ``epoch``, shape ``(steps, batch)``."""
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, size={size}), got {rank}")
    if batch < 1:
        raise ValueError(f"batch size must be >= 1, got {batch}")
    steps = n // (batch * size)
    if steps == 0:
        raise ValueError(f"{n} training examples cannot fill one step of {size} ranks x batch {batch}")
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return order[: steps * size * batch].reshape(steps, size, batch)[:, rank, :]
