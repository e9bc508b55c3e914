"""State a traced graph keeps: inside ``tf.function`` PowerSGD's Q and the residuals live in
variables the graph reads and writes at each run, so graph steps give what eager steps give, and
checkpoints taken and loaded around the graph's runs reach the graph."""
import numpy as np
import pytest
tf = pytest.importorskip("tensorflow")  # the pinned environment has it; the newest PyTorch's has not

from hvdsketch.compress import TensorContext, create
from hvdsketch.exchange.flight import run_local
from hvdsketch.compress.state import StateTable
from hvdsketch.memory import create as create_memory

SHAPE = (12, 10)
INPUTS = [tf.constant(np.random.default_rng(s).standard_normal(SHAPE).astype(np.float32)) for s in range(6)]


class Run:
    """One tensor's exchanges over one rank: a state table, a residual memory, a step function."""

    def __init__(self, flag: str, memory: str, graph: bool) -> None:
        self.table, self.memory, compressor = StateTable(), create_memory(memory), create(flag)

        def step(x):
            return run_local(compressor, x, TensorContext("w", SHAPE, 0, 1), self.memory, self.table)[0]

        self.step = tf.function(step) if graph else step

    def __call__(self, inputs) -> list[np.ndarray]:
        return [self.step(x).numpy() for x in inputs]

    def saved(self) -> tuple[dict, dict]:
        return self.table.state_dict(), self.memory.state_dict()

    def load(self, saved: tuple[dict, dict]) -> None:
        self.table.load_state_dict(saved[0], lambda name, array: tf.constant(array), create)
        self.memory.load_state_dict(saved[1])


@pytest.mark.parametrize("flag", ["powersgd:rank=2", "topk:ratio=0.25", "efsignsgd"])
def test_graph_steps_give_what_eager_steps_give(flag):
    eager, graph = Run(flag, "fp32", graph=False), Run(flag, "fp32", graph=True)
    for a, b in zip(eager(INPUTS), graph(INPUTS)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    (table_e, memory_e), (table_g, memory_g) = eager.saved(), graph.saved()
    np.testing.assert_allclose(memory_g["slots"]["w"]["e"], memory_e["slots"]["w"]["e"], rtol=1e-5, atol=1e-6)
    assert np.abs(memory_g["slots"]["w"]["e"]).sum() > 0  # the residual advanced in the graph
    if flag.startswith("powersgd"):
        np.testing.assert_allclose(table_g["w"]["state"]["q"], table_e["w"]["state"]["q"], rtol=1e-5, atol=1e-6)


def test_a_checkpoint_loaded_after_tracing_reaches_the_graph():
    """Saved after two graph steps and loaded after four, the graph's next two steps are the
    four's last two, bit for bit: the load wrote into the variables the graph holds."""
    run = Run("powersgd:rank=2", "fp32", graph=True)
    run(INPUTS[:2])
    saved = run.saved()
    after = run(INPUTS[2:4])
    run.load(saved)
    again = run(INPUTS[2:4])
    for a, b in zip(after, again):
        np.testing.assert_array_equal(b, a)


def test_a_checkpoint_loaded_before_the_first_trace_starts_the_graph():
    """An eager run's checkpoint after two steps, loaded before a graph is traced: the graph's
    two steps are the eager run's next two."""
    eager = Run("powersgd:rank=2", "fp32", graph=False)
    eager(INPUTS[:2])
    saved = eager.saved()
    after = eager(INPUTS[2:4])
    graph = Run("powersgd:rank=2", "fp32", graph=True)
    graph.load(saved)
    for a, b in zip(after, graph(INPUTS[2:4])):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_a_checkpoint_without_a_record_the_graph_holds_is_refused_whole():
    run = Run("powersgd:rank=2", "fp32", graph=True)
    run(INPUTS[:1])
    before = run.saved()
    with pytest.raises(ValueError, match="traced graph keeps the state of \\['w'\\]"):
        run.table.load_state_dict({}, lambda name, array: tf.constant(array), create)
    np.testing.assert_array_equal(run.saved()[0]["w"]["state"]["q"], before[0]["w"]["state"]["q"])
    assert run(INPUTS[1:2])  # and the graph still runs


def test_a_residual_the_checkpoint_lacks_starts_at_zero_in_the_graph():
    fresh, run = Run("topk:ratio=0.25", "fp32", graph=True), Run("topk:ratio=0.25", "fp32", graph=True)
    empty = fresh.saved()
    run(INPUTS[:2])
    run.load(empty)
    for a, b in zip(fresh(INPUTS[2:4]), run(INPUTS[2:4])):
        np.testing.assert_array_equal(b, a)


def test_a_store_a_graph_cannot_hold_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot hold"):
        Run("topk:ratio=0.25", "offload", graph=True)(INPUTS[:1])
