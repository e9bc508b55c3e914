"""Numbers that every rank derives alike from text (Python's ``hash`` is salted per process).

:func:`digest` names and checks things (setups, tensors, collectives); :func:`crc` is a 32-bit word for seeds.
"""
from __future__ import annotations

import hashlib
import zlib


def digest(text: str, bits: int = 62) -> int:
    """A ``bits``-bit digest of ``text`` (at most 64: the first 8 bytes of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> (64 - bits)


def crc(text: str) -> int:
    """The CRC-32 of ``text``: one 32-bit word for a seed."""
    return zlib.crc32(text.encode())
