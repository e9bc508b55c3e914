"""Run only by tests/unit/test_harness.py: rank 1 fails while rank 0 waits in a collective."""
import numpy as np


def test_rank1_fails_while_rank0_waits(comm):
    if comm.Get_rank() == 1:
        assert False, "deliberate failure on rank 1 only"
    comm.allreduce(np.ones(1))  # rank 1 never joins: without the abort this would hang
