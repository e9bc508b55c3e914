"""What the machine looked like while a run ran: cheap signals from /proc, to tell a run's mode.

On a small machine the same command can run in two modes (issue 22: whole
runs at ~50 or ~90 ms a step), depending on where the ranks and their
background threads land on the cores. :class:`Watch` samples, about once a
second while a run runs, how many threads the kernel has runnable
(``procs_running`` of ``/proc/stat``) and, for each of the run's rank
processes (found by the run folder on their command line), its CPU affinity,
its thread count, the CPUs its threads last ran on and their involuntary
context switches (a thread preempted for another: contention). The summary
goes into the run's result in ``bench.json`` beside the load average; the
report flags the runs whose step time left their entry's median.
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

PROC = Path("/proc")


def runnable() -> int | None:
    """Threads runnable right now, machine-wide (this reader included)."""
    try:
        line = next(x for x in (PROC / "stat").read_text().splitlines() if x.startswith("procs_running"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1])


def rank_pids(marker: str) -> list[int]:
    """Python processes with an argument inside the folder ``marker`` (a run's ranks; not its launchers)."""
    pids = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if words and Path(words[0]).name.startswith("python") and any(
                w == marker or w.startswith(marker + "/") for w in words[1:]):
            pids.append(int(entry.name))
    return sorted(pids)


def rank_state(pid: int) -> dict[str, Any] | None:
    """One process's affinity, threads, the CPUs they last ran on and their involuntary switches."""
    try:
        cpus, switches = set(), 0
        tasks = list((PROC / str(pid) / "task").iterdir())
        for task in tasks:
            stat = (task / "stat").read_text()
            cpus.add(int(stat.rsplit(")", 1)[1].split()[36]))  # field 39, "processor", after the name
            status = (task / "status").read_text()
            switches += next(int(x.split()[1]) for x in status.splitlines() if x.startswith("nonvoluntary_ctxt"))
        return {"pid": pid, "affinity": sorted(os.sched_getaffinity(pid)), "threads": len(tasks),
                "cpus": sorted(cpus), "nonvoluntary_switches": switches}
    except (OSError, StopIteration, ValueError, IndexError):
        return None  # it ended while read


class Watch:
    """Samples of a run's machine; :meth:`summary` is what its result keeps."""

    def __init__(self, run_dir: Path):
        self.marker = str(run_dir)
        self.runnable: list[int] = []
        self.ranks: dict[int, dict[str, Any]] = {}

    def sample(self) -> None:
        count = runnable()
        if count is not None:
            self.runnable.append(count)
        for pid in rank_pids(self.marker):
            state = rank_state(pid)
            if state is None:
                continue
            seen = self.ranks.get(pid, {"cpus": [], "threads": 0, "nonvoluntary_switches": 0})
            self.ranks[pid] = {**state, "cpus": sorted(set(seen["cpus"]) | set(state["cpus"])),
                               # the most seen: threads that ended take their counts with them
                               "threads": max(seen["threads"], state["threads"]),
                               "nonvoluntary_switches": max(seen["nonvoluntary_switches"],
                                                            state["nonvoluntary_switches"])}

    def summary(self) -> dict[str, Any]:
        """``runnable``: [min, median, max] over the samples; ``ranks``: each rank process's affinity,
        the most threads and involuntary switches seen, and every CPU its threads were seen on."""
        spread = ([min(self.runnable), statistics.median(self.runnable), max(self.runnable)]
                  if self.runnable else [])
        return {"samples": len(self.runnable), "runnable": spread, "ranks": list(self.ranks.values())}
