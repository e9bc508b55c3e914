"""Every rank of ``mpirun -np N python -m pytest tests/mpi/<suite>`` runs this session.

Ranks run the same tests in the same order, so their collectives match. A
test that fails on any rank aborts the whole job (``MPI_Abort``) right after
its report is printed: the other ranks may be blocked in a collective that
the failing rank will never join, and aborting turns that hang into a prompt,
visible failure. ``launch/test.sh`` also runs each job under a timeout.

Ranks also meet before every test and before they leave, in a barrier that sleeps while it waits.
The suites run 4 ranks on 2 cores, and a rank blocked in an MPI call spins: a rank that finished
its part early (or all its tests, waiting in ``MPI_Finalize``) takes the cores from the ranks it
waits for, and a loaded machine turned a 90 s suite into a 900 s timeout that way.
"""
from __future__ import annotations

import functools
import sys
import time

import pytest
from mpi4py import MPI


@functools.cache
def _meeting() -> MPI.Intracomm:
    """The ranks' meetings' own communicator, made on first use."""
    return MPI.COMM_WORLD.Dup()


def meet() -> None:
    """Wait for every rank, sleeping between polls instead of spinning."""
    request = _meeting().Ibarrier()
    pause = 1e-4
    while not request.Test():
        time.sleep(pause)
        pause = min(2 * pause, 0.01)


@pytest.hookimpl(tryfirst=True)  # before a skip mark is evaluated: every rank meets for every test
def pytest_runtest_setup(item: pytest.Item) -> None:
    meet()


def pytest_sessionfinish(session: pytest.Session) -> None:
    meet()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        rank = MPI.COMM_WORLD.Get_rank()
        sys.stderr.write(f"\n[rank {rank}] FAILED {item.nodeid} ({report.when})\n{report.longreprtext}\n"
                         f"[rank {rank}] aborting the MPI job so no rank waits forever\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


@pytest.fixture(scope="session")
def comm() -> MPI.Intracomm:
    """A communicator duplicated from COMM_WORLD, never the one Horovod uses."""
    dup = MPI.COMM_WORLD.Dup()
    yield dup
    dup.Free()
