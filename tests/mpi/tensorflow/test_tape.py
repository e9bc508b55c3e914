"""hvdsketch's TensorFlow tape against Horovod's own on the same data, argument by argument (op=Sum,
gradient_predivide_factor, process sets, sparse_as_dense, groups, local sources, Adasum), and its
overlap with backward inside tf.function shown on the traced graph."""
import numpy as np
import pytest
import tensorflow as tf

from hvdsketch.compress import create
from hvdsketch.tensorflow import DistributedGradientTape

MODES = [False, True]
MODE_IDS = ["eager", "tf.function"]


def mlp(layers: int = 4) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([tf.keras.Input((6,))] + [tf.keras.layers.Dense(8, activation="tanh", name=f"d{i}")
                                                         for i in range(layers)])


def embedding_model(vocab: int = 50) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([tf.keras.Input((5,), dtype="int64"), tf.keras.layers.Embedding(vocab, 4, name="emb"),
                                tf.keras.layers.Flatten(), tf.keras.layers.Dense(3, name="head")])


def batch(hvd, model):
    rng = np.random.default_rng(100 + hvd.rank())
    if model.inputs[0].dtype == tf.int64:
        return tf.constant(rng.integers(0, 50, size=(4, 5)))
    return tf.constant(rng.standard_normal((4, 6)).astype(np.float32))


def gradients(make_tape, model, x, graph: bool, local=()):
    """The tape's gradients of a fixed loss of ``model`` on ``x`` (``local``: variables registered as local)."""
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(model(x), tf.float32) ** 2)
        tape = make_tape(tape)
        for v in local:
            tape.register_local_source(v)
        return tape.gradient(loss, model.trainable_variables)

    grads = (tf.function(step) if graph else step)(x)
    return [tf.convert_to_tensor(g).numpy() for g in grads]


def assert_same(ours, theirs, rtol=1e-6):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-7)


CASES = {
    "op=Sum": lambda hvd: dict(op=hvd.Sum),
    "gradient_predivide_factor": lambda hvd: dict(gradient_predivide_factor=2.0),
    "groups=2": lambda hvd: dict(groups=2),
    "num_groups=3": lambda hvd: dict(num_groups=3),
    "fp16": lambda hvd: dict(compression=hvd.Compression.fp16),
}


@pytest.mark.parametrize("graph", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("case", CASES)
def test_argument_matches_horovods_tape(hvd, case, graph):
    model = mlp()
    x = batch(hvd, model)
    kwargs = CASES[case](hvd)
    theirs = gradients(lambda t: hvd.DistributedGradientTape(t, **kwargs), model, x, graph)
    ours = gradients(lambda t: DistributedGradientTape(t, **kwargs), model, x, graph)
    assert_same(ours, theirs, rtol=1e-3 if case == "fp16" else 1e-6)
    local = gradients(lambda t: t, model, x, graph)
    assert not all(np.array_equal(a, b) for a, b in zip(ours, local))  # reduced, not local


@pytest.mark.parametrize("graph", MODES, ids=MODE_IDS)
def test_groups_of_variables_match_horovods_tape(hvd, graph):
    model = mlp()
    x = batch(hvd, model)
    groups = [[model.layers[0].kernel, model.layers[3].kernel], [model.layers[1].bias]]
    theirs = gradients(lambda t: hvd.DistributedGradientTape(t, groups=groups), model, x, graph)
    ours = gradients(lambda t: DistributedGradientTape(t, groups=groups), model, x, graph)
    assert_same(ours, theirs)


@pytest.mark.parametrize("graph", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_as_dense_matches_horovods_tape(hvd, graph, sparse_as_dense):
    model = embedding_model()
    x = batch(hvd, model)
    theirs = gradients(lambda t: hvd.DistributedGradientTape(t, sparse_as_dense=sparse_as_dense), model, x, graph)
    ours = gradients(lambda t: DistributedGradientTape(t, sparse_as_dense=sparse_as_dense), model, x, graph)
    assert_same(ours, theirs)
    model = embedding_model(5000)  # large enough for the sketch to be smaller than dense
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    tape = DistributedGradientTape(tape, compression="sketch:density=0.05", sparse_as_dense=sparse_as_dense)
    grad = tape.gradient(loss, model.trainable_variables)[0]
    assert isinstance(grad, tf.IndexedSlices) != sparse_as_dense  # densified, or kept sparse by the sketch


@pytest.mark.parametrize("graph", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("scale", [True, False])
def test_local_sources_match_horovods_tape(hvd, graph, scale):
    model = mlp(2)
    x = batch(hvd, model)
    local = [model.layers[1].kernel]
    theirs = gradients(lambda t: hvd.DistributedGradientTape(t, scale_local_gradients=scale), model, x, graph, local)
    ours = gradients(lambda t: DistributedGradientTape(t, scale_local_gradients=scale), model, x, graph, local)
    assert_same(ours, theirs)


@pytest.fixture(scope="module")
def halves(hvd):
    """Two process sets, the lower and the upper half of the ranks (each one rank at np 2)."""
    n = hvd.size()
    sets = [hvd.add_process_set(list(range(n // 2))), hvd.add_process_set(list(range(n // 2, n)))]
    yield sets
    for process_set in sets:
        hvd.remove_process_set(process_set)


@pytest.mark.parametrize("graph", MODES, ids=MODE_IDS)
def test_two_process_sets_match_horovods_tape(hvd, halves, graph):
    model = mlp(2)
    x = batch(hvd, model)
    mine = halves[0] if halves[0].included() else halves[1]
    theirs = gradients(lambda t: hvd.DistributedGradientTape(t, process_set=mine), model, x, graph)
    ours = gradients(lambda t: DistributedGradientTape(t, process_set=mine), model, x, graph)
    assert_same(ours, theirs)
    # every rank passes the lower half: the upper half keeps its local gradients, as in Horovod
    theirs = gradients(lambda t: hvd.DistributedGradientTape(t, process_set=halves[0]), model, x, graph)
    ours = gradients(lambda t: DistributedGradientTape(t, process_set=halves[0]), model, x, graph)
    assert_same(ours, theirs)


def test_adasum_without_compression_is_horovods_own_and_with_compression_an_error(hvd):
    model = mlp(2)
    x = batch(hvd, model)
    theirs = gradients(lambda t: hvd.DistributedGradientTape(t, op=hvd.Adasum), model, x, graph=False)
    ours = gradients(lambda t: DistributedGradientTape(t, op=hvd.Adasum), model, x, graph=False)
    assert_same(ours, theirs)
    with pytest.raises(ValueError, match="non-linearly"):
        DistributedGradientTape(tf.GradientTape(), op=hvd.Adasum, compression="fp16")
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported"):
        DistributedGradientTape(tf.GradientTape(), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="groups should be"):
        DistributedGradientTape(tf.GradientTape(), groups=[1, 2])


# -- overlap with backward -------------------------------------------------------------------------


def traced(hvd, compression, groups=None, **kwargs):
    """The graph of a tf.function step of a 4-layer model, traced: the model, the local gradients
    (symbolic) that entered the exchange by variable name, and the Horovod ops by the name of the
    variable whose gradient they carry. ``groups(model)``: the tape's groups."""
    model = mlp()
    local = {}

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        tape = DistributedGradientTape(tape, compression=compression, groups=groups and groups(model), **kwargs)
        exchange = tape._exchange

        def recording(grads, sources, *args, **kw):
            local.update({s.name: g for s, g in zip(sources, grads)})
            return exchange(grads, sources, *args, **kw)

        tape._exchange = recording
        return tape.gradient(loss, model.trainable_variables)

    graph = step.get_concrete_function(tf.TensorSpec((4, 6), tf.float32)).graph
    collectives = {}
    for op in graph.get_operations():
        for v in model.trainable_variables:
            if op.type.startswith("Horovod") and v.name.removesuffix(":0").replace("/", "_") + "_" in op.name:
                collectives.setdefault(v.name, []).append(op)
    return model, local, collectives


def ancestors(op: tf.Operation) -> set:
    """Every op ``op`` waits for: its inputs' ops and control inputs, transitively."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


@pytest.mark.parametrize("compression", ["none", "fp16", "topk:ratio=0.25", "sketch:density=0.05", "qsgd"])
def test_first_exchange_does_not_wait_for_the_last_gradient_of_backward(hvd, compression):
    """Backward computes the last layer's gradient first and the input layer's last: the exchange of
    the last layer's kernel depends on its own gradient and not on the input layer's, so the runtime
    can start it while backward still runs."""
    model, local, collectives = traced(hvd, compression)
    first, last = model.layers[-1].kernel.name, model.layers[0].kernel.name
    assert collectives[first] and collectives[last]
    for op in collectives[first]:
        waits_for = ancestors(op)
        assert local[first].op in waits_for  # the analysis sees a dependence where there is one
        assert local[last].op not in waits_for
        assert not any(o.type.startswith("Horovod") for o in waits_for)  # nor on any other collective


@pytest.mark.parametrize("compression, memory", [("powersgd", None), ("sketch:density=0.05", "fp32"),
                                                 ("topk:ratio=0.25", "fp32")])
def test_a_stateful_exchange_does_not_wait_for_the_last_gradient_of_backward(hvd, compression, memory):
    """PowerSGD's Q and residual, and residual memory, live in variables the graph holds: the last
    layer's exchange (both of PowerSGD's rounds) waits for its own gradient and its own rounds
    alone, not for the input layer's gradient nor any other tensor's collective or state."""
    model, local, collectives = traced(hvd, compression, memory=memory)
    first, last = model.layers[-1].kernel.name, model.layers[0].kernel.name
    assert collectives[first] and collectives[last]
    others = {op for name, ops in collectives.items() if name != first for op in ops}
    for op in collectives[first]:
        waits_for = ancestors(op)
        assert local[first].op in waits_for
        assert local[last].op not in waits_for
        assert not waits_for & others
        assert not any(o.type in ("EagerPyFunc", "PyFunc") for o in waits_for)  # graph ops, no Python op
    assert len(collectives[first]) >= (2 if compression == "powersgd" else 1)



@pytest.mark.parametrize("compression, memory", [("sketch:error=0.5", "fp32"), ("sketch", None),
                                                 ("dgc:ratio=0.25", None), ("topk:ratio=0.25", "fp16")])
def test_an_exchange_kept_in_python_starts_while_backward_goes_on(hvd, compression, memory):
    """State a graph cannot hold (the sketch sized every step, DGC, a 16-bit residual memory) runs in
    Python ops at every step: the last layer's exchange starts in an op that waits for its own
    gradient, not for the input layer's, and the op that finishes every exchange waits for both."""
    model, local, _ = traced(hvd, compression, memory=memory)
    first, last = model.layers[-1].kernel.name, model.layers[0].kernel.name
    graph = local[first].graph
    starts = {op: ancestors(op) for op in graph.get_operations() if op.type == "EagerPyFunc"
              and op.name.split("/")[-1].startswith("hvdsketch_start")}
    assert len(starts) == len(model.trainable_variables)
    (start,) = [op for op in starts if local[first].name in [t.name for t in op.inputs]]
    assert local[first].op in starts[start] and local[last].op not in starts[start]
    # the starts run one after another in the order they were made, the same on every rank (a start's
    # eager collectives block it until every rank has started them)
    assert sorted(len(waits & set(starts)) for waits in starts.values()) == list(range(len(starts)))
    (finish,) = [op for op in graph.get_operations() if op.type == "EagerPyFunc" and "hvdsketch_finish" in op.name]
    assert {local[first].op, local[last].op} <= ancestors(finish) and set(starts) <= ancestors(finish)

def test_a_group_starts_together(hvd):
    """Horovod's groups: inside tf.function a group's exchanges wait for every gradient of the group."""
    model, local, collectives = traced(hvd, "none", groups=lambda m: [[m.layers[0].kernel, m.layers[3].kernel]])
    last = local[model.layers[0].kernel.name].op
    assert last in ancestors(collectives[model.layers[3].kernel.name][0])  # grouped with the input layer
    assert last not in ancestors(collectives[model.layers[2].kernel.name][0])  # not grouped


def test_device_dense_places_the_exchange(hvd):
    _, _, placed = traced(hvd, "topk:ratio=0.25", device_dense="/cpu:0")
    _, _, unplaced = traced(hvd, "topk:ratio=0.25")
    assert all(op.device.endswith("CPU:0") for ops in placed.values() for op in ops)
    assert all(op.device == "" for ops in unplaced.values() for op in ops)


@pytest.mark.parametrize("flag, memory", [("powersgd:rank=2", None), ("topk:ratio=0.25", "fp32"), ("sketch", None)])
def test_exchange_keeping_state_runs_inside_tf_function_as_eagerly(hvd, flag, memory):
    """PowerSGD's warm start and residuals, residual memory (graph ops holding variables), the sketch
    sized every step (Python ops every step): three steps inside tf.function give what three eager
    steps give (bit for bit but for float rounding)."""
    rng = np.random.default_rng(hvd.rank())
    inputs = [tf.constant(rng.standard_normal((12, 10)).astype(np.float32) * (rng.random((12, 1)) < 0.3))
              for _ in range(3)]
    finals = []
    for graph in MODES:
        compression = create(flag)  # an object of its own: an exchanger of its own
        w = tf.Variable(np.ones((12, 10), np.float32), name="w")

        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.sin(w * x))
            grad = DistributedGradientTape(tape, compression=compression, memory=memory).gradient(loss, [w])[0]
            w.assign_sub(0.5 * grad)

        run = tf.function(step) if graph else step
        for x in inputs:
            run(x)
        finals.append(w.numpy())
    np.testing.assert_allclose(finals[1], finals[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(finals[0], 1.0)


@pytest.mark.parametrize("flag, tags", [("topk:ratio=0.25", 3), ("powersgd:rank=2", 3), ("sketch", 0)])  # a Python op
def test_report_counts_every_step_eager_or_inside_tf_function(hvd, flag, tags):
    """``tape.report()``: three steps inside tf.function (a trace's exchange that the graph runs every
    step, or a Python op every step) count what three eager steps count, but for the step tag each
    eager step sends beside its gradients and a traced step does not (``tags`` of them)."""
    from hvdsketch.collectives.stats import ring_allreduce_bytes

    rng = np.random.default_rng(hvd.rank())
    inputs = [tf.constant(rng.standard_normal((12, 10)).astype(np.float32)) for _ in range(3)]
    reports = []
    for graph in MODES:
        compression = create(flag)  # an object of its own: an exchanger of its own
        w = tf.Variable(np.ones((12, 10), np.float32), name="w")
        tapes = []

        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.sin(w * x))
            tapes.append(DistributedGradientTape(tape, compression=compression))
            w.assign_sub(0.5 * tapes[-1].gradient(loss, [w])[0])

        run = tf.function(step) if graph else step
        for x in inputs:
            run(x)
        reports.append(tapes[-1].report())
    eager, traced = reports
    assert eager["steps"] == traced["steps"] == 3
    assert traced["bytes_sent"] == eager["bytes_sent"] - tags * ring_allreduce_bytes(6 * 8, hvd.size()) > 0
    assert traced["bytes_dense_allreduce"] == eager["bytes_dense_allreduce"] == ring_allreduce_bytes(
        3 * 12 * 10 * 4, hvd.size())
    assert traced["ratio"] == traced["bytes_dense_allreduce"] / traced["bytes_sent"]


@pytest.mark.parametrize("front", ["tape", "keras"])
def test_tracing_logs_nothing_from_autograph(hvd, front):
    """Inside ``tf.function`` hvdsketch's code is plain Python over ops, never AutoGraph's to convert:
    a traced step with the tape or the tf-keras optimizer (sketch with residual memory, PowerSGD)
    logs no "AutoGraph could not transform ... Please report this to the TensorFlow team"."""
    import logging

    import hvdsketch.tensorflow as hvdsketch_tf

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    tf.get_logger().addHandler(handler)
    try:
        for flag, memory in [("sketch:error=0.5", "fp32"), ("powersgd:rank=2", None)]:
            model = mlp(2)
            x = batch(hvd, model)
            if front == "keras":
                optimizer = hvdsketch_tf.keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=flag,
                                                                    memory=memory)
                model.compile(optimizer=optimizer, loss="mse")
                model.fit(x, tf.zeros((4, 8)), batch_size=4, epochs=2, verbose=0)
            else:
                gradients(lambda tape: DistributedGradientTape(tape, compression=flag, memory=memory),
                          model, x, graph=True)
    finally:
        tf.get_logger().removeHandler(handler)
    said = [record.getMessage() for record in records if "AutoGraph" in record.getMessage()]
    assert not said, said[0]
