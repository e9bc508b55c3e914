"""The targets of the benchmark (issues 7 and 8), checked against one run's measurements.

Per cell (workload, link rate, ranks) a target compares its *subject* entry
with a *baseline* entry of the same cell. Issue 7's targets are about the
matrix's subject (sparse-sketch) against its baseline (dense Horovod
allreduce); issue 8's about ``auto``:

==========================  ========  =====  =================================================================
target                      workload  rate   requirement
==========================  ========  =====  =================================================================
embedding exchange          lstm      1gbit  the probed tensor's exchange time at least 81% below baseline
                                             (also for ``sketch-ef``, the paper-like sizing with error feedback)
speed-up                    lstm      1gbit  baseline step time / subject step time >= 1 (the speed-up is reported)
quality                     lstm      1gbit  validation perplexity within 2% of baseline
speed-up                    fasttext  1gbit  baseline step time / subject step time >= 1.8
ahead of peers              fasttext  1gbit  at 4 ranks, faster per step than every other entry that ran
quality                     fasttext  1gbit  validation accuracy within 2% (relative) of baseline
dense fallback              fashion   any    step time at most 5% above baseline
auto vs DDP+PowerSGD        lstm      1gbit  ``auto`` no slower per step than ``ddp-powersgd``
auto quality                lstm      1gbit  ``auto``'s perplexity within 2% of baseline
auto unshaped               lstm      none   ``auto`` at most 5% slower than baseline: it knows when not to compress
auto on dense gradients     fashion   any    ``auto`` at most 5% slower than the faster of baseline and ``ddp-powersgd``
==========================  ========  =====  =================================================================

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
    subject: str
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
    subject: str | None = None   # None: the matrix's subject
    baseline: str | None = None  # None: the matrix's baseline


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


def slower_by_at_most(fraction: float, or_than: Sequence[str] = ()):
    """Subject's step time at most ``fraction`` above the baseline's, or above the fastest of the
    baseline and the entries ``or_than`` that ran."""
    def check(cell, subject, baseline):
        pair = _pair(cell, subject, baseline, "step_s")
        if pair is None:
            return None
        rivals = {label: cell[label].step_s for label in (baseline, *or_than)
                  if label in cell and cell[label].step_s is not None}
        best = min(rivals, key=rivals.get)
        extra = pair[0] / rivals[best] - 1
        return f"{extra:+.1%} step time" + (f" vs {best}" if or_than else ""), extra <= fraction
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


def at(rate: str, ranks: Sequence[int] = (2, 4)) -> Callable[[str, int], bool]:
    return lambda r, n: r == rate and n in ranks


def anywhere(rate: str, ranks: int) -> bool:
    return True


TARGETS = (
    Target("embedding exchange", "lstm", ">= 81% less than dense", at(RATE), exchange_cut(0.81)),
    Target("embedding exchange", "lstm", ">= 81% less than dense", at(RATE), exchange_cut(0.81), subject="sketch-ef"),
    Target("speed-up", "lstm", ">= 1x dense", at(RATE), speedup(1.0)),
    Target("quality", "lstm", "perplexity within 2% of dense", at(RATE), quality_within(0.02)),
    Target("speed-up", "fasttext", ">= 1.8x dense", at(RATE), speedup(1.8)),
    Target("ahead of peers", "fasttext", "fastest entry", at(RATE, (4,)), ahead_of_peers),
    Target("quality", "fasttext", "accuracy within 2% of dense", at(RATE), quality_within(0.02)),
    Target("dense fallback", "fashion", "<= 5% slower than dense", anywhere, slower_by_at_most(0.05)),
    Target("auto vs DDP+PowerSGD", "lstm", "no slower than ddp-powersgd", at(RATE), speedup(1.0),
           subject="auto", baseline="ddp-powersgd"),
    Target("auto quality", "lstm", "perplexity within 2% of dense", at(RATE), quality_within(0.02), subject="auto"),
    Target("auto unshaped", "lstm", "<= 5% slower than dense", at("none"), slower_by_at_most(0.05),
           subject="auto"),
    Target("auto on dense gradients", "fashion", "<= 5% slower than the best of dense, ddp-powersgd", anywhere,
           slower_by_at_most(0.05, or_than=("ddp-powersgd",)), subject="auto"),
)


def evaluate(cells: Cells, subject: str, baseline: str, measured_cells: Iterable[tuple[str, str, int]],
             targets: Sequence[Target] = TARGETS) -> list[Verdict]:
    """A verdict per target and per cell it applies to, among the cells the matrix ran
    (``measured_cells``, failed runs included, so a failure reads ``not measured``); ``subject`` and
    ``baseline`` are the matrix's, for the targets that name none of their own."""
    out = []
    for target in targets:
        mine, theirs = target.subject or subject, target.baseline or baseline
        for workload, rate, ranks in measured_cells:
            if workload != target.workload or not target.applies(rate, ranks):
                continue
            result = target.check(cells.get((workload, rate, ranks), {}), mine, theirs)
            measured, met = result if result is not None else ("-", None)
            out.append(Verdict(target.name, mine, workload, rate, ranks, measured, target.required, met))
    return out
