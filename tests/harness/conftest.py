"""The harness under test is the MPI suites' own (tests/mpi/conftest.py), not a copy."""
from tests.mpi.conftest import comm, pytest_runtest_makereport  # noqa: F401
