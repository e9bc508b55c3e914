"""A temporary folder every rank of an MPI test sees (one machine): made on rank 0, its path broadcast."""
from __future__ import annotations

import shutil
import tempfile
from typing import Any, Iterator


def shared_folder(hvd: Any, prefix: str) -> Iterator[str]:
    """For a fixture: yields the folder's path on every rank, and removes it once every rank is done
    (``hvd``: ``horovod.torch`` or ``horovod.tensorflow``, both of which broadcast objects)."""
    path = hvd.broadcast_object(tempfile.mkdtemp(prefix=prefix) if hvd.rank() == 0 else None, 0,
                                name=f"{prefix}.folder")
    yield path
    hvd.broadcast_object(None, 0, name=f"{prefix}.done")  # every rank is done with it
    if hvd.rank() == 0:
        shutil.rmtree(path)
