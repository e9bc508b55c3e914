"""Reading the sketch's plan-overflow warnings, for the PyTorch and TensorFlow MPI tests of it."""
from __future__ import annotations

import re
import warnings
from contextlib import contextmanager
from typing import Iterator

STATED = re.compile(r"hvdsketch: .* on (.+?) of shape \(([\d, ]+)\): .* relative error is about ([\d.]+) "
                    r"against error=([\d.]+); (.*)")


@contextmanager
def hvdsketch_warnings() -> Iterator[list[str]]:
    """The texts of hvdsketch's warnings raised in the block (every one, not once per place)."""
    texts: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield texts
    texts.extend(str(w.message) for w in caught if str(w.message).startswith("hvdsketch:"))


def stated(messages: list[str]) -> dict[tuple[int, ...], tuple[str, float, str]]:
    """By tensor shape: the name, the expected error and the advice each overflow warning states."""
    out = {}
    for message in messages:
        match = STATED.match(message)
        assert match, message
        out[tuple(int(n) for n in re.findall(r"\d+", match[2]))] = (match[1], float(match[3]), match[5])
    return out


def assert_names_the_error_measured(messages: list[str], errors: dict[tuple[int, ...], float],
                                    names: dict[tuple[int, ...], str]) -> dict[tuple[int, ...], str]:
    """Each tensor of ``names`` (by shape) is warned about by its name, with an expected error within
    a factor 1.6 of the one measured, far above what was asked; returns the advice by shape."""
    said = stated(messages)
    assert set(names) <= set(said), messages
    for shape, name in names.items():
        assert said[shape][0] == name
        assert errors[shape] > 1.0  # far above the 0.5 asked for
        assert 0.6 < said[shape][1] / errors[shape] < 1.6, (said[shape], errors[shape])
    return {shape: said[shape][2] for shape in names}
