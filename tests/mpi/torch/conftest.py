import pytest


@pytest.fixture(scope="session")
def hvd():
    """``horovod.torch``, initialised once per rank."""
    import horovod.torch as hvd

    hvd.init()
    return hvd
