"""Tiny array back-ends, so each algorithm is written once.

The ``numpy``, ``torch`` and ``tensorflow`` modules implement :class:`hvdsketch.ops.contract.Ops`; algorithms call
the one :func:`backend` returns for their tensor. Integer arithmetic is int64, so hashes agree across back-ends.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, cast

from hvdsketch.ops.contract import Ops

_MODULES = {"numpy": "numpy", "torch": "torch", "tensorflow": "tensorflow"}


def backend(tensor: Any) -> Ops:
    """The ops module for ``tensor``'s framework (numpy, torch or tensorflow); ``TypeError`` for any other."""
    root = type(tensor).__module__.split(".")[0]
    if root not in _MODULES:
        raise TypeError(f"hvdsketch: no array back-end for {type(tensor).__name__} "
                        f"(module {type(tensor).__module__}); expected one of {sorted(_MODULES)}")
    name = f"{__name__}.{_MODULES[root]}"
    return cast(Ops, sys.modules.get(name) or importlib.import_module(name))
