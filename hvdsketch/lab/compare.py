"""One run against a dense run: step time and bytes, from the JSON records ``hvdsketch train`` writes.

::

    hvdsketch compare runs/main/dense runs/main/run

Each argument is a record or a folder (its newest record). The step time is the median over the
steps after each run's first (which pays one-time costs: allocations, ``auto``'s link probe), so a
few slow steps do not decide it; the bytes are the run's bytes sent a step against a dense
allreduce of the same gradients, counted over all its steps. It prints one line::

    == lstm, 2 ranks, auto against dense: step 348.0 vs 589.6 ms (1.69x faster), 9.858 vs 24.73 MB a step (2.51x fewer bytes)

and refuses records of different workloads or rank counts.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from hvdsketch.policy import label
from hvdsketch.spec import SpecError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dense", help="record (or folder of records) of a run with compression none")
    parser.add_argument("record", help="record (or folder of records) of the run to compare")


def load(path: str) -> dict[str, Any]:
    """The record at ``path``, or the newest record in the folder ``path``."""
    where = Path(path)
    if where.is_dir():
        records = sorted(where.glob("*.json"), key=lambda p: p.stat().st_mtime)
        if not records:
            raise SpecError(f"{path}: no record of hvdsketch train (*.json) in this folder")
        where = records[-1]
    return json.loads(where.read_text())


def step_seconds(record: dict[str, Any]) -> float:
    """The median step time after the first step (all steps if there is only one)."""
    steps = record["steps_s"]
    return statistics.median(steps[1:] or steps)


def summary(dense: dict[str, Any], run: dict[str, Any]) -> str:
    """The one line comparing ``run`` with ``dense`` (see the module's docstring)."""
    for key in ("workload", "size"):
        if dense[key] != run[key]:
            raise SpecError(f"the records differ in {key}: {dense[key]!r} (dense) and {run[key]!r}")
    if label(dense["compression"]) != "none":
        raise SpecError(f"the dense record's compression is {dense['compression']!r}, not none")
    dense_s, run_s = step_seconds(dense), step_seconds(run)
    sent, full = run["bytes_sent_per_step"], run["bytes_dense_per_step"]
    return (f"== {label(run['config']['workload'])}, {run['size']} ranks, {label(run['compression'])} against dense: "
            f"step {1000 * run_s:.1f} vs {1000 * dense_s:.1f} ms ({dense_s / run_s:.2f}x faster), "
            f"{sent / 1e6:.4g} vs {full / 1e6:.4g} MB a step ({full / sent:.2f}x fewer bytes)")


def run(args: argparse.Namespace) -> int:
    print(summary(load(args.dense), load(args.record)))
    return 0
