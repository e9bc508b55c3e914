"""The targets of the benchmark (issue 7), checked against one run's measurements.

Per cell (workload, link rate, ranks) the *subject* entry (sparse-sketch) is
compared with the *baseline* (dense Horovod allreduce) of the same cell:

==================  =========  ================================================================
target              workload   requirement (1 Gbit/s)
==================  =========  ================================================================
embedding exchange  lstm       the probed tensor's exchange time at least 81% below baseline
speed-up            lstm       baseline step time / subject step time >= 1 (the speed-up is reported)
quality             lstm       validation perplexity within 2% of baseline
speed-up            fasttext   baseline step time / subject step time >= 1.8
ahead of peers      fasttext   at 4 ranks, faster per step than every other entry that ran
quality             fasttext   validation accuracy within 2% (relative) of baseline
dense fallback      fashion    step time at most 5% above baseline, at every rate and rank count
==================  =========  ================================================================

A target whose runs failed, or whose cell was not run, is ``not measured``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

RATE = "1gbit"


@dataclass(frozen=True)
class Outcome:
    """What one entry measured in one cell (``None``: failed or not run)."""

    step_s: float | None
    quality: float | None
    higher_is_better: bool
    probe_s: float | None = None


#: (workload, rate, ranks) -> label -> outcome
Cells = Mapping[tuple[str, str, int], Mapping[str, Outcome]]


@dataclass(frozen=True)
class Verdict:
    target: str
    workload: str
    rate: str
    ranks: int
    measured: str
    required: str
    met: bool | None  # None: not measured

    @property
    def word(self) -> str:
        return {True: "met", False: "MISSED", None: "not measured"}[self.met]


@dataclass(frozen=True)
class Target:
    name: str
    workload: str
    required: str
    applies: Callable[[str, int], bool]  # (rate, ranks) -> does this cell count
    check: Callable[[Mapping[str, Outcome], str, str], tuple[str, bool] | None]  # (cell, subject, baseline)


def _pair(cell: Mapping[str, Outcome], subject: str, baseline: str, field: str) -> tuple[float, float] | None:
    s, b = cell.get(subject), cell.get(baseline)
    values = (getattr(s, field, None), getattr(b, field, None))
    return None if None in values else values  # type: ignore[return-value]


def exchange_cut(at_least: float):
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, baseline, "probe_s")
        if pair is None:
            return None
        cut = 1 - pair[0] / pair[1]
        return f"{cut:.0%} less ({1e3 * pair[0]:.0f} vs {1e3 * pair[1]:.0f} ms)", cut >= at_least
    return check


def speedup(at_least: float):
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, baseline, "step_s")
        if pair is None:
            return None
        ratio = pair[1] / pair[0]
        return f"{ratio:.2f}x", ratio >= at_least
    return check


def slower_by_at_most(fraction: float):
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, baseline, "step_s")
        if pair is None:
            return None
        extra = pair[0] / pair[1] - 1
        return f"{extra:+.1%} step time", extra <= fraction
    return check


def quality_within(fraction: float):
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, baseline, "quality")
        if pair is None:
            return None
        worse = (pair[1] - pair[0]) / pair[1] if cell[subject].higher_is_better else (pair[0] - pair[1]) / pair[1]
        return f"{pair[0]:.4g} vs {pair[1]:.4g} ({max(worse, 0):.1%} worse)", worse <= fraction
    return check


def ahead_of_peers(cell, subject, baseline):
    mine = cell.get(subject)
    peers = {label: o.step_s for label, o in cell.items() if label != subject and o.step_s is not None}
    if mine is None or mine.step_s is None or not peers:
        return None
    best = min(peers, key=peers.get)
    return (f"{1e3 * mine.step_s:.0f} ms vs best peer {best} {1e3 * peers[best]:.0f} ms",
            mine.step_s < peers[best])


def at_1gbit(ranks: Sequence[int]) -> Callable[[str, int], bool]:
    return lambda rate, n: rate == RATE and n in ranks


TARGETS = (
    Target("embedding exchange", "lstm", ">= 81% less than dense", at_1gbit((2, 4)), exchange_cut(0.81)),
    Target("speed-up", "lstm", ">= 1x dense", at_1gbit((2, 4)), speedup(1.0)),
    Target("quality", "lstm", "perplexity within 2% of dense", at_1gbit((2, 4)), quality_within(0.02)),
    Target("speed-up", "fasttext", ">= 1.8x dense", at_1gbit((2, 4)), speedup(1.8)),
    Target("ahead of peers", "fasttext", "fastest entry", at_1gbit((4,)), ahead_of_peers),
    Target("quality", "fasttext", "accuracy within 2% of dense", at_1gbit((2, 4)), quality_within(0.02)),
    Target("dense fallback", "fashion", "<= 5% slower than dense", lambda rate, n: True, slower_by_at_most(0.05)),
)


def evaluate(cells: Cells, subject: str, baseline: str, measured_cells: Iterable[tuple[str, str, int]],
             targets: Sequence[Target] = TARGETS) -> list[Verdict]:
    """A verdict per target and per cell it applies to, among the cells the matrix ran
    (``measured_cells``, failed runs included, so a failure reads ``not measured``)."""
    out = []
    for target in targets:
        for workload, rate, ranks in measured_cells:
            if workload != target.workload or not target.applies(rate, ranks):
                continue
            result = target.check(cells.get((workload, rate, ranks), {}), subject, baseline)
            measured, met = result if result is not None else ("-", None)
            out.append(Verdict(target.name, workload, rate, ranks, measured, target.required, met))
    return out
