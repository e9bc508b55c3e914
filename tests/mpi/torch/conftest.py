import os

import pytest


@pytest.fixture(scope="session")
def hvd():
    """``horovod.torch``, initialised once per rank, with process sets that tests may add."""
    import horovod.torch as hvd

    os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    hvd.init()
    return hvd
