"""A dense result goes into the memory it was given (``TensorContext.out``, the gradient's own), with
the values it has without it: for every compressor, in the back-ends whose tensors can be written."""
import numpy as np
import pytest
import torch

from hvdsketch.compress import REGISTRY, TensorContext, create
from hvdsketch.exchange.flight import run_local
from hvdsketch.compress.state import StateTable

BACKENDS = {"numpy": (np.asarray, lambda a: a.ctypes.data), "torch": (torch.from_numpy, torch.Tensor.data_ptr)}
#: A matrix with a third of its rows non-zero, a vector whose last block is short (256-element blocks).
SHAPES = [(60, 40), (1000,)]


def gradient(shape: tuple[int, ...], step: int) -> np.ndarray:
    rng = np.random.default_rng(step)
    g = rng.standard_normal(shape).astype(np.float32)
    g[rng.random(shape[0]) < 2 / 3] = 0
    return g


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("flag", sorted(REGISTRY))
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_dense_result_is_written_into_the_memory_given(backend, flag, shape):
    made, address = BACKENDS[backend]
    compressor, given, fresh = create(flag), StateTable(), StateTable()  # one state table for each run
    out = made(np.full(shape, np.nan, np.float32))
    for step in range(3):  # the sketch's first exchange is dense, later ones sized from it
        g = made(gradient(shape, step))
        result, _ = run_local(compressor, g, TensorContext("w", shape, step, 1, out=out), states=given)
        expected, _ = run_local(compressor, g, TensorContext("w", shape, step, 1), states=fresh)
        assert address(result) == address(out) and tuple(result.shape) == shape
        assert address(expected) != address(out)  # what the check tells apart
        np.testing.assert_array_equal(np.asarray(result), np.asarray(expected))



@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("flag", sorted(REGISTRY))
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_result_written_over_the_gradient_it_averages_has_the_values_it_has_elsewhere(backend, flag, shape):
    """``out`` is the gradient's own memory (PyTorch's optimizer): the exact methods then write only
    the union's units, the rest being 0 already; every unit of the result is right all the same."""
    made, address = BACKENDS[backend]
    compressor, given, fresh = create(flag), StateTable(), StateTable()
    for step in range(3):
        g = made(gradient(shape, step))
        expected, _ = run_local(compressor, made(gradient(shape, step)), TensorContext("w", shape, step, 1),
                                states=fresh)
        result, _ = run_local(compressor, g, TensorContext("w", shape, step, 1, out=g), states=given)
        assert address(result) == address(g)
        np.testing.assert_array_equal(np.asarray(result), np.asarray(expected))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_fp16_writes_its_message_into_the_memory_of_the_step_before(backend):
    """One read and one write each way: the 16-bit message of every step after the first goes into
    the memory the tensor's state keeps, which a checkpoint leaves out."""
    made, address = BACKENDS[backend]
    compressor, states, shape = create("fp16"), StateTable(), (60, 40)
    out = made(np.zeros(shape, np.float32))
    wires = []
    for step in range(3):
        g = made(gradient(shape, step))
        result, rounds = run_local(compressor, g, TensorContext("w", shape, step, 1, out=out), states=states)
        wires.append(address(rounds[0][0].tensor))
        np.testing.assert_array_equal(np.asarray(result), np.asarray(g).astype(np.float16).astype(np.float32))
    assert wires[0] == wires[1] == wires[2]
    assert states.state_dict() == {"w": {"compressor": "fp16", "state": {}}}
    other = run_local(compressor, made(gradient((30, 40), 0)), TensorContext("w", (30, 40), 3, 1), states=states)[1]
    assert address(other[0][0].tensor) != wires[0]  # another shape: new memory
