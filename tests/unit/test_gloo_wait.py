"""A wait over gloo polls while its rank has its core to itself, and sleeps once another rank that
polls shares the core (:func:`hvdsketch.collectives.torchdist.poll`): two ranks yielding to each
other would otherwise switch the core back and forth for the whole wait."""
import os
import subprocess
import sys
import time

import pytest

from hvdsketch.collectives import torchdist


class Work:
    """A collective in flight: completes ``seconds`` from now."""

    def __init__(self, seconds: float) -> None:
        self.done_at = time.perf_counter() + seconds

    def is_completed(self) -> bool:
        return time.perf_counter() >= self.done_at


@pytest.fixture
def one_core():
    """This process on one core (the cluster's pinning), and its affinity back after."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    yield min(before)
    os.sched_setaffinity(0, before)


def test_a_rank_alone_on_its_core_polls_until_its_collective_completes(one_core):
    """Each poll returns done, or once other threads took the core (a machine busy with other jobs);
    of ten tries, where the core was free for a few milliseconds at least one polls through."""
    completed = 0
    for _ in range(10):
        work, before = Work(0.005), torchdist._switched_away()
        torchdist.poll(work)
        assert work.is_completed() or torchdist._switched_away() - before > torchdist.YIELDED_AWAY
        completed += work.is_completed()
    assert completed > 0


def test_a_rank_sharing_its_core_with_a_polling_rank_stops_polling(one_core, monkeypatch):
    other = subprocess.Popen([sys.executable, "-c", "import os\nwhile True:\n    os.sched_yield()"])
    try:
        os.sched_setaffinity(other.pid, {one_core})
        time.sleep(0.1)
        with monkeypatch.context() as unbounded:  # without the limit: polled through, yielding to the other
            unbounded.setattr(torchdist, "YIELDED_AWAY", 10**9)
            work, before = Work(0.2), torchdist._switched_away()
            torchdist.poll(work)
            assert work.is_completed() and torchdist._switched_away() - before > 1000
        work, before = Work(2.0), torchdist._switched_away()
        torchdist.poll(work)
        assert not work.is_completed()  # it returned long before, to sleep in work.wait()
        assert torchdist._switched_away() - before <= torchdist.YIELDED_AWAY + 64
    finally:
        other.kill()
        other.wait()
