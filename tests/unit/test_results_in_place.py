"""A dense result goes into the memory it was given (``TensorContext.out``, the gradient's own), with
the values it has without it: for every compressor, in the back-ends whose tensors can be written."""
import numpy as np
import pytest
import torch

from hvdsketch.compress import REGISTRY, TensorContext, create
from hvdsketch.compress.flight import run_local

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
    given, fresh = create(flag), create(flag)  # stateful methods: one object for each run, alike
    out = made(np.full(shape, np.nan, np.float32))
    for step in range(3):  # the sketch's first exchange is dense, later ones sized from it
        g = made(gradient(shape, step))
        result, _ = run_local(given, g, TensorContext("w", shape, step, 1, out=out))
        expected, _ = run_local(fresh, g, TensorContext("w", shape, step, 1))
        assert address(result) == address(out) and tuple(result.shape) == shape
        assert address(expected) != address(out)  # what the check tells apart
        np.testing.assert_array_equal(np.asarray(result), np.asarray(expected))

