"""What the loss-scaler tests of every front end share: the flags they train with, and a check that a
step left without trace left hvdsketch's state exactly as it was."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

#: Every kind of method, with error feedback where it keeps a residual.
FLAGS = [("none", None), ("fp16", None), ("powersgd:rank=2", None), ("topk:ratio=0.25", "fp32"),
         ("sketch:error=0.5", "fp32"), ("allgather", None), ("auto", "fp32")]
#: The steps whose loss overflows on rank 0 alone.
OVERFLOWS = (2, 4)


def assert_same_state(before: Any, after: Any, where: str = "state") -> None:
    """``before`` and ``after`` (an exchanger's ``state_dict()``: dicts, lists, arrays, numbers,
    strings) are equal, arrays bit for bit."""
    assert type(before) is type(after) or (np.isscalar(before) and np.isscalar(after)), where
    if isinstance(before, Mapping):
        assert set(before) == set(after), f"{where}: keys {sorted(before)} != {sorted(after)}"
        for key in before:
            assert_same_state(before[key], after[key], f"{where}[{key!r}]")
    elif isinstance(before, (list, tuple)):
        assert len(before) == len(after), where
        for k, (b, a) in enumerate(zip(before, after)):
            assert_same_state(b, a, f"{where}[{k}]")
    elif isinstance(before, np.ndarray) or hasattr(before, "numpy"):
        b, a = np.asarray(before), np.asarray(after)
        assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(b, a, equal_nan=b.dtype.kind in "fc"), where
    else:
        assert before == after, f"{where}: {before!r} != {after!r}"
