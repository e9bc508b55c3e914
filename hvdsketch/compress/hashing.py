"""Carter-Wegman hashing in int64 without overflow, identical on every rank and back-end.

Bucket (universal family of Carter & Wegman, 1979)::

    bucket_j(i) = (((a_j * k + b_j) mod p) + c) mod p mod cols

and sign from a degree-3 polynomial (4-wise independent)::

    h_j(i) = (((s3 * k + s2) mod p * k + s1) mod p * k + s0 + c) mod p,  sign = 1 - 2 (h mod 2)

with p = 2^31 - 1, k = i mod p and c = i div p, so coordinates of tensors
longer than 2^31 fall into distinct chunks. Every coefficient is below 2^31
and every product is reduced mod p before the next multiply, so no
intermediate exceeds 2^62. Only the coordinates actually touched are hashed;
nothing is precomputed per coordinate.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

P = 2**31 - 1


@dataclass(frozen=True)
class HashFamily:
    """``rows`` independent (bucket, sign) hash pairs onto ``cols`` columns."""

    coefficients: tuple[tuple[int, ...], ...]  # per row: a, b, s3, s2, s1, s0
    cols: int

    @classmethod
    def draw(cls, rows: int, cols: int, seed: int, name: str = "", step: int = 0) -> "HashFamily":
        """Coefficients from ``seed`` mixed with the tensor's name and the step (equal on all ranks)."""
        entropy = [seed & 0xFFFFFFFF, zlib.crc32(name.encode()), step & 0xFFFFFFFF]
        coeffs = np.random.default_rng(np.random.SeedSequence(entropy)).integers(1, P, size=(rows, 6))
        return cls(tuple(tuple(int(c) for c in row) for row in coeffs), cols)

    @property
    def rows(self) -> int:
        return len(self.coefficients)

    def bucket(self, ops: ModuleType, row: int, coords: Any) -> Any:
        a, b, *_ = self.coefficients[row]
        key, chunk = coords % P, coords // P
        return (((a * key + b) % P + chunk) % P) % self.cols

    def sign(self, ops: ModuleType, row: int, coords: Any, dtype: str) -> Any:
        _, _, s3, s2, s1, s0 = self.coefficients[row]
        key, chunk = coords % P, coords // P
        h = ((((s3 * key + s2) % P) * key + s1) % P * key + s0 + chunk) % P
        return ops.cast(1 - 2 * (h % 2), dtype)
