"""hvdsketch's state in an FSDP checkpoint: every rank its own, as FSDP's sharded state is.

:meth:`FSDPReduction.state_dict <hvdsketch.torch.fsdp.FSDPReduction.state_dict>` gives this rank's
entry::

    {"world": N, "setup": "compression ... memory ...", "rank<r>": <this rank's state>}

The setup and the world are the same on every rank; the rank's state (its exchangers' steps, policy
decisions, compressors' records and error-feedback residuals) is one ``bytes`` value, written by
``torch.save`` with every array a tensor, so PyTorch's default ``torch.load`` (``weights_only=True``)
reads it. ``torch.distributed.checkpoint`` saves each rank's entry under its own key and the shared
ones once, and loads each rank's own (:func:`unpack`); so does the plain habit of one file a rank
(``torch.save(reduction.state_dict(), f"hvdsketch-{rank}.pt")``).
"""
from __future__ import annotations

import io
from typing import Any, Mapping

import numpy as np
import torch


def key(rank: int) -> str:
    """The entry holding rank ``rank``'s state."""
    return f"rank{rank}"


def pack(state: Mapping[str, Any]) -> bytes:
    """``state`` (nested dicts and lists of numpy arrays and plain values) as ``torch.save``'s bytes,
    every array a tensor, every 0-d text array its text."""
    buffer = io.BytesIO()
    torch.save(_tensors(state), buffer)
    return buffer.getvalue()


def unpack(blob: bytes) -> Any:
    """What :func:`pack` packed, every tensor a numpy array again (read by ``torch.load``'s default)."""
    if not isinstance(blob, (bytes, bytearray)):
        raise ValueError(f"hvdsketch: a rank's entry of the FSDP state is not what state_dict() wrote "
                         f"(got {type(blob).__name__})")
    return _arrays(torch.load(io.BytesIO(blob)))


def _tensors(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tensors(v) for v in value]
    if isinstance(value, np.ndarray) and value.dtype.kind == "U":
        return str(value)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value).copy())
    if isinstance(value, np.generic):
        return value.item()
    return value


def _arrays(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _arrays(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_arrays(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.numpy()
    return value
