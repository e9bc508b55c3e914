"""hvdsketch's DistributedGradientTape over a tape already wrapped, by Horovod or by hvdsketch: a clear
error naming the fix (without the check, Python's own ``TypeError: _DistributedGradientTape.__init__()
missing 6 required positional arguments``)."""
import pytest
import tensorflow as tf

import hvdsketch.tensorflow


@pytest.mark.parametrize("whose", ["hvd", "hvdsketch.tensorflow"])
def test_a_tape_wrapped_already_is_a_clear_error(hvd, whose):
    variable = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(variable * variable)
    wrap = hvd.DistributedGradientTape if whose == "hvd" else hvdsketch.tensorflow.DistributedGradientTape
    inner = wrap(tape)
    with pytest.raises(TypeError, match=rf"a tape that {whose}.DistributedGradientTape already wrapped .*reduced "
                                        r"twice; wrap the tf.GradientTape once, with hvdsketch.tensorflow"
                                        r".DistributedGradientTape alone"):
        hvdsketch.tensorflow.DistributedGradientTape(inner, compression="topk:ratio=0.5")
    # the inner tape still reduces as it did: every rank's gradient is the same
    assert inner.gradient(loss, [variable])[0].numpy().tolist() == [2.0, 4.0]
