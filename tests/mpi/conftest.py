"""Every rank of ``mpirun -np N python -m pytest tests/mpi/<suite>`` runs this session.

Ranks run the same tests in the same order, so their collectives match. A
test that fails on any rank aborts the whole job (``MPI_Abort``) right after
its report is printed: the other ranks may be blocked in a collective that
the failing rank will never join, and aborting turns that hang into a prompt,
visible failure. ``launch/test.sh`` also runs each job under a timeout.
"""
from __future__ import annotations

import sys

import pytest
from mpi4py import MPI


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
