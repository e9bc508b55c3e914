"""Every peer compressor through hvdsketch's exchange over Horovod's TensorFlow collectives
matches the in-process reference built from all ranks' inputs (tests/peer_cases.py)."""
import pytest
import tensorflow as tf

from hvdsketch.collectives.horovod import HorovodCommunicator
from hvdsketch.exchange import exchange_all
from tests import peer_cases as cases


@pytest.mark.parametrize("case", cases.CASES, ids=str)
def test_matches_reference(hvd, case):
    cases.check_exchange(case, hvd.size(), hvd.rank(), HorovodCommunicator(hvd), tf.convert_to_tensor, exchange_all)


def test_all_compressors_in_one_lock_step_exchange(hvd):
    cases.check_lock_step(hvd.size(), hvd.rank(), HorovodCommunicator(hvd), tf.convert_to_tensor, exchange_all)
