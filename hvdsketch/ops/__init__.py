"""Tiny array back-ends, so each algorithm is written once.

Every back-end module (`numpy`, `torch`, `tensorflow`) implements the same
protocol, :class:`hvdsketch.ops.contract.Ops` (which documents each function);
algorithms call them through the module that :func:`backend` returns for their
input tensor and never import a framework themselves. Creating functions take
the tensor they are like, so what they make lives on the gradient's device.
Integer arithmetic is int64 throughout, so hashes agree bit for bit across
back-ends.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, cast

from hvdsketch.ops.contract import Ops

_MODULES = {"numpy": "numpy", "torch": "torch", "tensorflow": "tensorflow"}


def backend(tensor: Any) -> Ops:
    """The ops module for ``tensor``'s framework (numpy, torch or tensorflow).

    Raises ``TypeError`` for a tensor of no other framework."""
    root = type(tensor).__module__.split(".")[0]
    if root not in _MODULES:
        raise TypeError(f"hvdsketch: no array back-end for {type(tensor).__name__} "
                        f"(module {type(tensor).__module__}); expected one of {sorted(_MODULES)}")
    name = f"{__name__}.{_MODULES[root]}"
    return cast(Ops, sys.modules.get(name) or importlib.import_module(name))
