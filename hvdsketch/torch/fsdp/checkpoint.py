"""hvdsketch's state in an FSDP checkpoint: every rank its own, as FSDP's sharded state is.

:meth:`FSDPReduction.state_dict <hvdsketch.torch.fsdp.FSDPReduction.state_dict>` gives this rank's entry::

    {"world": N, "setup": "compression ... memory ...", "rank<r>": <this rank's state>}

The rank's state is ``torch.save``'s bytes with every array a tensor, so the default ``torch.load`` reads it.
``torch.distributed.checkpoint`` saves each rank's entry under its own key and loads each rank's own, as does
one file a rank (``torch.save(reduction.state_dict(), f"hvdsketch-{rank}.pt")``).
"""
from __future__ import annotations

import io
from typing import Any, Mapping

import torch

from hvdsketch.torch import saved


def key(rank: int) -> str:
    """The entry holding rank ``rank``'s state."""
    return f"rank{rank}"


def pack(state: Mapping[str, Any]) -> bytes:
    """``state`` (nested dicts and lists of numpy arrays and plain values) as ``torch.save``'s bytes,
    every array a tensor (:func:`hvdsketch.torch.saved.to_torch`)."""
    buffer = io.BytesIO()
    torch.save(saved.to_torch(state), buffer)
    return buffer.getvalue()


def unpack(blob: bytes) -> Any:
    """What :func:`pack` packed, every tensor a numpy array again (read by ``torch.load``'s default)."""
    if not isinstance(blob, (bytes, bytearray)):
        raise ValueError(f"hvdsketch: a rank's entry of the FSDP state is not what state_dict() wrote "
                         f"(got {type(blob).__name__})")
    return saved.to_numpy(torch.load(io.BytesIO(blob)))
