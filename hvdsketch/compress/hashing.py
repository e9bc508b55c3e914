"""Count-sketch hashes in int64 without overflow, identical on every rank and back-end.

Element ``i`` of a tensor cut into units (:class:`hvdsketch.compress.support.Layout`) is the pair
``(unit u, offset o)``; each sketch row ``j`` draws one hash pair on units and one on offsets and combines them::

    bucket_j(u, o) = (hu_j(u) + ho_j(o)) mod cols        sign_j(u, o) = su_j(u) * so_j(o)

which collides with probability ``1/cols`` and has unbiased signs, as a fully random count sketch. Each hash on
int64 keys ``k`` is a Carter-Wegman (1979) polynomial over the prime ``p = 2^31 - 1``, of degree 2 for buckets
(3-wise independent) and 3 for signs (4-wise)::

    x = k                                 (k < p)
    x = (f * (k div p) + k mod p) mod p   (larger keys: the high part is hashed into the key)
    bucket(k) = (((a2 x + a1) mod p) x + a0) mod p  mod cols
    sign(k)   = 1 - 2 (((((s3 x + s2) mod p) x + s1) mod p x + s0) mod p  mod 2)

Coefficients are below ``2^31`` and every product is reduced mod p before the next, so no intermediate exceeds
``2^62``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hvdsketch.digests import crc
from hvdsketch.ops.contract import Ops

P = 2**31 - 1


@dataclass(frozen=True)
class KeyHash:
    """One universal (bucket, sign) pair on non-negative int64 keys."""

    a2: int
    a1: int
    a0: int
    s3: int
    s2: int
    s1: int
    s0: int
    fold: int

    def field(self, keys: Any, bound: int) -> Any:
        """``keys`` (all below ``bound``) as elements of GF(p), the high part folded in."""
        if bound <= P:
            return keys
        high = keys // P
        return (self.fold * high + (keys - high * P)) % P

    def bucket(self, keys: Any, cols: int, bound: int) -> Any:
        x = self.field(keys, bound)
        return ((((self.a2 * x + self.a1) % P) * x + self.a0) % P) % cols

    def sign(self, ops: Ops, keys: Any, dtype: str, bound: int) -> Any:
        x = self.field(keys, bound)
        h = ((((self.s3 * x + self.s2) % P) * x + self.s1) % P * x + self.s0) % P
        return ops.cast(1 - 2 * (h % 2), dtype)


@dataclass(frozen=True)
class HashFamily:
    """``rows`` independent (bucket, sign) hashes of ``(unit, offset)`` pairs onto ``cols`` columns."""

    units: tuple[KeyHash, ...]
    offsets: tuple[KeyHash, ...]
    cols: int

    @classmethod
    def draw(cls, rows: int, cols: int, seed: int, name: str = "", step: int = 0) -> "HashFamily":
        """Coefficients from ``seed`` mixed with the tensor's name and the step (equal on all ranks)."""
        entropy = [seed & 0xFFFFFFFF, crc(name), step & 0xFFFFFFFF, step >> 32 & 0xFFFFFFFF]
        coeffs = np.random.default_rng(np.random.SeedSequence(entropy)).integers(1, P, size=(2, rows, 8))
        unit, offset = ([KeyHash(*(int(c) for c in row)) for row in part] for part in coeffs)
        return cls(tuple(unit), tuple(offset), cols)

    @property
    def rows(self) -> int:
        return len(self.units)

    def buckets(self, ops: Ops, row: int, units: Any, unit_len: int, bound: int) -> Any:
        """Flat buckets of every element of ``units`` (int64, unit by unit), for units numbered below ``bound``."""
        offsets = self.offsets[row].bucket(ops.arange(unit_len, like=units), self.cols, unit_len)
        return ops.outer_add(self.units[row].bucket(units, self.cols, bound), offsets) % self.cols

    def signs(self, ops: Ops, row: int, units: Any, unit_len: int, dtype: str, bound: int) -> Any:
        """Flat signs (``dtype``, +-1) of every element of ``units``, row-major as :meth:`buckets`."""
        offsets = self.offsets[row].sign(ops, ops.arange(unit_len, like=units), dtype, unit_len)
        return ops.flatten(ops.reshape(self.units[row].sign(ops, units, dtype, bound), (-1, 1))
                           * ops.reshape(offsets, (1, -1)))

    def element_buckets(self, ops: Ops, row: int, units: Any, offsets: Any, unit_len: int, bound: int) -> Any:
        """Buckets of the elements ``(units[k], offsets[k])`` (the same as :meth:`buckets` gives them)."""
        return (self.units[row].bucket(units, self.cols, bound) + self.offsets[row].bucket(offsets, self.cols, unit_len)
                ) % self.cols

    def element_signs(self, ops: Ops, row: int, units: Any, offsets: Any, unit_len: int, dtype: str,
                      bound: int) -> Any:
        """Signs of the elements ``(units[k], offsets[k])`` (the same as :meth:`signs` gives them)."""
        return self.units[row].sign(ops, units, dtype, bound) * self.offsets[row].sign(ops, offsets, dtype, unit_len)
