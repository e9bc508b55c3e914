"""Seeds that every rank derives alike, for compressors that draw random numbers.

The seed mixes the flag's base seed with the tensor's name, the step and the purpose of the draw, so draws change
every step and differ between tensors, yet are the same on every rank (the back-end's ``uniform`` is a pure
function of it). Rounding that must differ by rank mixes the rank into the purpose.
"""
from __future__ import annotations

import numpy as np

from hvdsketch.digests import crc


def derive(seed: int, name: str, step: int, purpose: str) -> int:
    """A 63-bit seed from the base ``seed``, the tensor ``name``, the ``step`` and a ``purpose`` label."""
    entropy = [seed & 0xFFFFFFFF, crc(name), step & 0xFFFFFFFF, crc(purpose)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))
