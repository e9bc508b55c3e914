"""Every rank of ``mpirun -np N python -m pytest tests/mpi/ddp`` joins one gloo process group.

The rendezvous is the lab's DDP baseline's (:mod:`hvdsketch.lab.bench.ddp`): ranks from
Open MPI's environment, a TCP store served by rank 0 on a port derived from the MPI job. The
abort-on-failure hook of ``tests/mpi/conftest.py`` applies here too: a test failing on one rank
ends the job instead of leaving the others in a collective. No Horovod is imported.
"""
import pytest
import torch.distributed as dist

from hvdsketch.lab.bench.ddp import TIMEOUT, _destroy, _leave, _store, launch_env


@pytest.fixture(scope="session", autouse=True)
def process_group():
    """The default process group over gloo, torn down after the session (rank 0, which serves the
    store, last)."""
    rank, size, _ = launch_env()
    store = _store(rank, size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    yield dist.group.WORLD
    dist.barrier()
    _destroy()
    _leave(store, rank, size)
