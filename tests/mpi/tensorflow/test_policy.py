"""Per-tensor policies through hvdsketch's TensorFlow tape: auto decides eagerly after its warm-up,
or when a tf.function is traced (from eager stand-ins); every rank agrees; replicas stay identical."""
import zlib

import numpy as np
import tensorflow as tf

from hvdsketch.policy import AutoPolicy
from hvdsketch.tensorflow import DistributedGradientTape

SLOW = "bandwidth=10mbit,latency=100us"


def agreed(hvd, text: str) -> bool:
    digests = hvd.allgather(tf.constant([zlib.crc32(text.encode())], tf.int64), name="agreed").numpy()
    return bool((digests == digests[0]).all())


def model_and_data(hvd):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((8,), dtype="int64"), tf.keras.layers.Embedding(3000, 16),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(5)])
    rng = np.random.default_rng(hvd.rank())
    batches = [(rng.integers(0, 3000, size=(16, 8)), rng.integers(0, 5, size=16)) for _ in range(6)]
    return model, batches


def run(model, batches, policy, graph: bool):
    optimizer = tf.keras.optimizers.SGD(0.1)
    sparse = []

    def step(tokens, labels):
        with tf.GradientTape() as tape:
            logits = model(tokens, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        grads = DistributedGradientTape(tape, compression=policy).gradient(loss, model.trainable_variables)
        sparse.append(isinstance(grads[0], tf.IndexedSlices))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    step = tf.function(step) if graph else step
    for tokens, labels in batches:
        step(tokens, labels)
    return sparse


def test_eager_auto_decides_after_warmup_and_ranks_agree(hvd, assert_replicas_identical):
    model, batches = model_and_data(hvd)
    policy = AutoPolicy(f"auto:warmup=3,{SLOW}")
    run(model, batches[:2], policy, graph=False)
    assert policy.pending  # three dense warm-up steps, the last of which decides
    run(model, batches[2:], policy, graph=False)
    table = policy.assignment
    assert table is not None and agreed(hvd, repr([(r.tensor, r.compressor, r.density) for r in table]))
    embedding = table[0]
    assert embedding.shape == (3000, 16) and embedding.density < 0.2  # measured on the IndexedSlices
    assert embedding.compressor.split(":")[0] in ("allgather", "union", "balanced", "topk", "sketch", "powersgd")  # compressed
    assert_replicas_identical(model, "policy.replicas")


def test_tf_function_decides_at_trace_time(hvd, assert_replicas_identical):
    """Traced before any eager step: auto decides from stand-ins, with its collectives run eagerly,
    and the graph keeps that decision; the embedding's stand-in holds the batch's looked-up rows."""
    model, batches = model_and_data(hvd)
    policy = AutoPolicy(f"auto:warmup=3,{SLOW}")
    sparse = run(model, batches, policy, graph=True)
    table = policy.assignment
    assert table is not None and agreed(hvd, repr([(r.tensor, r.compressor) for r in table]))
    assert table[0].density == 16 * 8 / 3000  # one stand-in row per looked-up token
    assert table[0].compressor.split(":")[0] in ("topk", "sketch", "powersgd")  # compressed, and a graph can run it
    if table[0].compressor.startswith("sketch"):
        assert all(sparse)  # IndexedSlices stay sparse through the sketch
    assert_replicas_identical(model, "policy.replicas")


def test_flag_string_names_one_policy_across_tapes(hvd):
    model, batches = model_and_data(hvd)
    run(model, batches[:2], "auto:warmup=1,bandwidth=100gbit,latency=1us", graph=False)
    tape = DistributedGradientTape(tf.GradientTape(), compression="auto:warmup=1,bandwidth=100gbit,latency=1us")
    assert not tape._session.policy.pending  # the warm-up of the earlier tapes counted
    again = DistributedGradientTape(tf.GradientTape(), compression="auto:warmup=1,bandwidth=100gbit,latency=1us")
    assert again._session.policy is tape._session.policy  # one policy, its decisions kept
    table = tape._session.policy.assignment
    assert table is not None and agreed(hvd, repr([(r.tensor, r.compressor) for r in table]))
