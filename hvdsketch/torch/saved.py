"""hvdsketch's checkpoint as PyTorch saves it: CPU tensors where the engine keeps numpy arrays.

PyTorch's default ``torch.load`` (``weights_only=True``) loads no numpy arrays: :func:`to_torch` converts the
engine's checkpoint (:mod:`hvdsketch.exchange.checkpoint`) where a front end hands it out, and
:func:`to_numpy` converts it back, bit for bit, so its checksum holds.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import torch


def to_torch(tree: Any) -> Any:
    """``tree`` (dicts, lists, tuples) with every numpy array or scalar a CPU tensor of its dtype.

    Raises:
        TypeError: an array of strings or objects (the engine keeps strings as ``str``).
    """
    if isinstance(tree, Mapping):
        return {key: to_torch(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_torch(value) for value in tree)
    if isinstance(tree, (np.ndarray, np.generic)):
        array = np.asarray(tree)
        if array.dtype.kind not in "biufc":
            raise TypeError(f"hvdsketch: a checkpoint's array of dtype {array.dtype} cannot be saved as a tensor")
        return torch.from_numpy(np.array(array, copy=True))
    return tree


def to_numpy(tree: Any) -> Any:
    """``tree`` with every tensor a numpy array (from wherever ``torch.load``'s ``map_location`` put it)."""
    if isinstance(tree, Mapping):
        return {key: to_numpy(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_numpy(value) for value in tree)
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu().numpy()
    return tree


def converter(devices: Mapping[str, torch.device]) -> Callable[[str, np.ndarray], torch.Tensor]:
    """What makes a checkpoint's array a tensor on its tensor's device (by name; the CPU if not in ``devices``)."""
    return lambda name, array: torch.from_numpy(np.array(array)).to(devices.get(name, "cpu"))
