"""Starting mpirun / horovodrun from a test process.

Once any test module imports ``mpi4py.MPI``, this pytest process is an MPI
singleton, and Open MPI has set launch variables in its C-level environment.
A child ``mpirun`` that inherits them fails at once with no output. Passing
an explicit environment built from ``os.environ`` (which never saw those
variables) gives the child a clean one.
"""
from __future__ import annotations

import os


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a child MPI launcher."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMIX_", "ORTE_", "OMPI_COMM_WORLD_"))}
    env.update(extra)
    return env
