"""Every rank of ``mpirun -np N python -m pytest tests/mpi/fsdp`` joins one gloo process group, the
DDP suite's (:mod:`tests.mpi.ddp.conftest`): FSDP2's collectives and hvdsketch's run over it."""
from tests.mpi.ddp.conftest import process_group  # noqa: F401 (the session's process group)
