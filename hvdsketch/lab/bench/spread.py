"""A figure measured over repeats: its centre and its spread (the smallest and largest value).

Every figure of ``hvdsketch bench train`` is measured k times (the repeats of
an entry, interleaved with the other entries of its cell). A figure is then a
:class:`Spread`: the median of the repeats (the mean for quality over seeds)
and the range ``low..high`` they cover. With k = 3 an interquartile range
would be two of the three values; the full range is what the repeats showed.

A ratio of two figures (a speed-up) is the ratio of their centres. Its spread
comes from pairs of repeats where both figures keep their rounds (step times:
the entries of a cell run in rounds, A B C A B C, so the two runs of a round
met the machine within minutes of each other) in :data:`PAIRED` rounds at
least: from the smallest to the largest ratio of one round's two runs, as the
exchange probe pairs its steps (:func:`hvdsketch.lab.bench.exchange.ratio`). A machine that drifts
between rounds (its load, its mode) moves both runs of a round and leaves their
ratio; a run that alone lands in a slow mode still widens the spread. Otherwise
the spread is the extreme ratios: ``a.over(b)`` from ``a.low / b.high`` to
``a.high / b.low``. Either way a target decided on the ratio's whole spread
holds whichever repeats were the lucky ones, and the ratio of the medians lies
inside it. Where the two entries do not differ, all k pairs fall on one side by
chance once in ``2^(k-1)`` (1 in 16 at 5 pairs), all 3 repeats of one entry
beyond all 3 of the other once in 10: fewer than :data:`PAIRED` pairs would
decide more easily than the extremes do.
``math.inf`` is a value like any other (a run that never reached a quality took
forever); it prints as ``never``.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Hashable, Iterable, Mapping

#: The fewest rounds both figures of a ratio ran in for their pairs to spread it.
PAIRED = 5


@dataclass(frozen=True)
class Spread:
    """``center`` (median or mean of ``n`` values) within ``low..high``."""

    center: float
    low: float
    high: float
    n: int = 1
    #: ``(round, value)`` of each repeat where the figure keeps its rounds (:meth:`by_round`)
    rounds: tuple[tuple[Hashable, float], ...] = ()

    @classmethod
    def point(cls, value: float) -> "Spread":
        return cls(value, value, value, 1)

    @classmethod
    def median(cls, values: Iterable[float | None]) -> "Spread | None":
        """The median of the values that are not ``None`` (``None`` if there are none)."""
        found = [float(v) for v in values if v is not None]
        return cls(statistics.median(found), min(found), max(found), len(found)) if found else None

    @classmethod
    def by_round(cls, values: Mapping[Hashable, float]) -> "Spread | None":
        """The median of each round's value, keeping the rounds (any keys that order) for :meth:`over`
        to pair."""
        spread = cls.median(values.values())
        return spread and replace(spread, rounds=tuple(sorted((r, float(v)) for r, v in values.items())))

    @classmethod
    def mean(cls, values: Iterable[float | None]) -> "Spread | None":
        """The mean of the values that are not ``None`` (quality over seeds)."""
        found = [float(v) for v in values if v is not None]
        return cls(statistics.fmean(found), min(found), max(found), len(found)) if found else None

    def over(self, other: "Spread") -> "Spread":
        """``self / other``: the ratio of the centres, spread from the ratios of the rounds both
        have (:data:`PAIRED` at least), else from the extreme ratios."""
        theirs = dict(other.rounds)
        ratios = [_div(value, theirs[r]) for r, value in self.rounds if r in theirs]
        if len(ratios) >= PAIRED:
            return Spread(_div(self.center, other.center), min(ratios), max(ratios), len(ratios))
        return Spread(_div(self.center, other.center), _div(self.low, other.high), _div(self.high, other.low),
                      min(self.n, other.n))

    def times(self, other: "Spread") -> "Spread":
        """``self x other``, spread from the extreme products (both positive)."""
        return Spread(self.center * other.center, self.low * other.low, self.high * other.high, min(self.n, other.n))

    def scaled(self, factor: float) -> "Spread":
        return Spread(self.center * factor, self.low * factor, self.high * factor, self.n)

    def text(self, digits: int = 4, suffix: str = "", scale: float = 1.0) -> str:
        """``"50.8 (49.1..52.3)"``; the centre alone where the spread rounds to nothing."""
        center, low, high = (_fmt(scale * v, digits) for v in (self.center, self.low, self.high))
        return center + suffix + ("" if low == high else f" ({low}..{high})")

    def percent(self) -> str:
        """A ratio as a change: ``"+1.2% (-0.5%..+3.0%)"``."""
        center, low, high = (f"{v - 1:+.1%}" for v in (self.center, self.low, self.high))
        return center + ("" if low == high else f" ({low}..{high})")

    def bounds(self) -> tuple[float, float, float]:
        """``(center, low, high)``, as the plots take a figure with its error bar."""
        return self.center, self.low, self.high


def _div(a: float, b: float) -> float:
    return math.inf if b == 0 else a / b


def _fmt(value: float, digits: int) -> str:
    return "never" if math.isinf(value) else "-" if math.isnan(value) else f"{value:.{digits}g}"
