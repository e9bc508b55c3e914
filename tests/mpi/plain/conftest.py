import pytest

from hvdsketch.collectives.mpi import MPICommunicator


@pytest.fixture(scope="module")
def mpi(comm):
    """hvdsketch's MPI communicator over the session's communicator, freed after each module."""
    communicator = MPICommunicator(comm)
    yield communicator
    communicator.free()
