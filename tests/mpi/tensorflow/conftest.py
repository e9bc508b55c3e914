import os

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


@pytest.fixture(scope="session")
def hvd():
    """``horovod.tensorflow``, initialised once per rank."""
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd
