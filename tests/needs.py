"""Marks for tests that need what one of the project's environments lacks.

The pinned environment (``launch/setup.sh``) has everything; the newest PyTorch's
(``launch/torch-env.sh``) has neither Horovod (built against the pinned PyTorch only) nor
TensorFlow, and runs ``tests/unit`` and ``tests/mpi/ddp`` with the rest skipped::

    from tests import needs

    @needs.horovod
    def test_...

    pytestmark = needs.horovod  # every test of a module

A module that imports TensorFlow at its top takes ``pytest.importorskip("tensorflow")`` instead.
"""
import importlib.util

import pytest


def _mark(module: str, what: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {what}")


#: Horovod (its jobs, its optimizer and tape, horovodrun).
horovod = _mark("horovod", "Horovod (built against the pinned PyTorch)")
#: TensorFlow (its workloads and back-end).
tensorflow = _mark("tensorflow", "TensorFlow")
