"""Every peer compressor through hvdsketch's exchange over Horovod's TensorFlow collectives
matches the in-process reference built from all ranks' inputs (tests/peer_cases.py)."""
import pytest
import tensorflow as tf

from hvdsketch.collectives.horovod import HorovodCommunicator
from tests import peer_cases as cases


@pytest.fixture
def world(hvd):
    return cases.World(hvd.size(), hvd.rank(), HorovodCommunicator(hvd), tf.convert_to_tensor)


@pytest.mark.parametrize("case", cases.CASES, ids=str)
def test_matches_reference(world, case):
    cases.check_exchange(case, world)


def test_all_compressors_in_one_lock_step_exchange(world):
    cases.check_lock_step(world)


@pytest.mark.parametrize("flag", cases.NAN_FLAGS)
def test_a_nan_on_one_rank_fails_on_every_rank(world, flag):
    cases.check_nan_fails_everywhere(flag, world, FloatingPointError)
