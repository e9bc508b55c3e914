"""Seeds that every rank derives alike, for compressors that draw random numbers.

A compressor's random draws (random-k's coordinates, QSGD's and TernGrad's
rounding, DGC's threshold sample, PowerSGD's first Q) come from the ops
back-end's seeded generator (:func:`hvdsketch.ops.numpy.uniform` and its
torch / TensorFlow twins), so within one back-end they are a pure function of
the seed. The seed mixes the flag's base seed with the tensor's name, the
step and the purpose of the draw, so draws change every step and differ
between tensors, yet are the same on every rank where they must be (random-k's
coordinates, PowerSGD's first Q); QSGD's and TernGrad's rounding mixes in the
rank, since independent rounding errors are what averaging over ranks shrinks.
"""
from __future__ import annotations

import numpy as np

from hvdsketch.digests import crc


def derive(seed: int, name: str, step: int, purpose: str) -> int:
    """A 63-bit seed from the base ``seed``, the tensor ``name``, the ``step`` and a ``purpose`` label."""
    entropy = [seed & 0xFFFFFFFF, crc(name), step & 0xFFFFFFFF, crc(purpose)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))
