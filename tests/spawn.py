"""Starting mpirun / horovodrun from a test process.

Once any test module imports ``mpi4py.MPI``, this pytest process is an MPI
singleton, and Open MPI has set launch variables in its C-level environment.
A child ``mpirun`` that inherits them fails at once with no output. Passing
an explicit environment built from ``os.environ`` (which never saw those
variables) gives the child a clean one.

A launcher's ranks are its children: killing the launcher alone on a timeout
would leave them running (and loading the machine for the tests after it), so
:func:`launched` runs it in a session of its own and ends the whole session.
"""
from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a child MPI launcher."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMIX_", "ORTE_", "OMPI_COMM_WORLD_"))}
    env.update(extra)
    return env


def launched(cmd: list[str], *, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)`` for a
    launcher (``mpirun``, ``torchrun``) whose ranks are its children: it runs in a session of its
    own, and whatever of that session is left when it ends or times out is killed.

    Raises:
        subprocess.TimeoutExpired: as ``subprocess.run``, once every process of the session is killed.
    """
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          **kwargs) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_session(child.pid)
            child.communicate()
            raise
        finally:
            _kill_session(child.pid)
    return subprocess.CompletedProcess(cmd, child.returncode, stdout, stderr)


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
