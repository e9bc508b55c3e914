import os

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")  # test_tape adds process sets


@pytest.fixture(scope="session")
def hvd():
    """``horovod.tensorflow``, initialised once per rank."""
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd
