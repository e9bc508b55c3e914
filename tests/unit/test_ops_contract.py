"""The three array back-ends implement :class:`hvdsketch.ops.contract.Ops`, nothing more, nothing less;
and TensorFlow's creating functions place what they make on the device of the tensor they are like."""
import inspect
import subprocess
import sys
import textwrap
import types

import pytest

pytest.importorskip("tensorflow")  # the pinned environment has it; the newest PyTorch's has not
from hvdsketch.ops import contract, numpy as np_ops, tensorflow as tf_ops, torch as torch_ops  # noqa: E402

BACKENDS = {"numpy": np_ops, "torch": torch_ops, "tensorflow": tf_ops}
FUNCTIONS = sorted(name for name, member in vars(contract.Ops).items()
                   if inspect.isfunction(member) and not name.startswith("_"))
#: Where a back-end still differs from the contract, and why (strict: fixing it must drop the entry).


def public_functions(module: types.ModuleType) -> set[str]:
    return {name for name, member in vars(module).items()
            if inspect.isfunction(member) and member.__module__ == module.__name__ and not name.startswith("_")}


def parameters(function) -> list[tuple[str, str, object, object]]:
    """Name, kind, default and annotation (as written) of each parameter, ``self`` left out."""
    return [(p.name, p.kind.name, p.default, p.annotation)
            for p in inspect.signature(function).parameters.values() if p.name != "self"]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_each_backend_defines_exactly_the_contracts_functions(backend):
    module = BACKENDS[backend]
    assert public_functions(module) == set(FUNCTIONS)
    assert module.name == backend
    assert module.writable is (backend != "tensorflow")


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_each_function_has_the_contracts_signature(backend, function):
    assert parameters(getattr(BACKENDS[backend], function)) == parameters(getattr(contract.Ops, function))


def test_the_signature_check_can_fail():
    def zeros(n, dtype, like=None):
        pass

    assert parameters(zeros) != parameters(contract.Ops.zeros)


def test_every_creating_function_takes_the_tensor_it_is_like():
    creating = ["zeros", "arange", "constant", "uniform", "from_numpy", "to_device"]
    for function in creating:
        names = [p[0] for p in parameters(getattr(contract.Ops, function))]
        assert names[-1] == "like", function


TF_PLACEMENT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from hvdsketch.ops import tensorflow as ops

    with tf.device("/CPU:1"):
        like = tf.ones(4)
        idx = tf.constant([0, 2], tf.int64)
        values = tf.ones(2)
    made = {"zeros": ops.zeros(3, "float32", like), "arange": ops.arange(3, like),
            "constant": ops.constant([1, 2], "int64", like), "uniform": ops.uniform(3, 7, like),
            "from_numpy": ops.from_numpy(np.ones(2), like), "to_device": ops.to_device(np.ones(2), like),
            "indicator": ops.indicator(4, idx, "uint8"), "scatter": ops.scatter(4, idx, values),
            "scatter_add": ops.scatter_add(4, idx, values)}
    unplaced = tf.range(3)  # what an op without placement does: TensorFlow's default device
    assert unplaced.device.endswith("CPU:0"), unplaced.device
    wrong = {name: t.device for name, t in made.items() if not t.device.endswith("CPU:1")}
    assert not wrong, wrong
    print("placed", len(made))
""")


def test_tensorflow_makes_tensors_on_the_device_of_like():
    """Two logical CPUs stand in for two devices (a fresh process: they must be set before TensorFlow starts)."""
    done = subprocess.run([sys.executable, "-c", TF_PLACEMENT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "placed 9" in done.stdout


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_finite_flag_and_check_see_every_nan_and_inf(backend, dtype):
    import numpy as np

    ops = BACKENDS[backend]
    like = _tensor(backend, np.zeros(1, dtype))
    for bad in (np.nan, np.inf, -np.inf):
        for at in (0, 500, 999):
            values = np.arange(1000, dtype=dtype) - 500
            values[at] = bad
            x = ops.from_numpy(values, like)
            assert not ops.all_true([ops.all_finite_flag(x)]), (bad, at)
            with pytest.raises(_nonfinite_error(backend), match="named"):
                ops.check_finite(x, "named")
    finite = ops.from_numpy(np.arange(1000, dtype=dtype) - 500, like)
    assert ops.all_true([ops.all_finite_flag(finite)])
    assert ops.all_true([ops.all_finite_flag(ops.zeros(0, dtype, like))])
    assert ops.check_finite(finite, "named") is finite


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_nonzero_rows_are_the_rows_with_a_bit_set(backend, dtype):
    """Zero rows are left out; NaN, -0.0 and the smallest subnormal count; a non-contiguous view too."""
    import numpy as np

    rows = np.zeros((9, 6), dtype)
    rows[1, 5], rows[3, 0], rows[4, 2], rows[6, 3] = np.nan, -0.0, np.finfo(dtype).smallest_subnormal, -2
    ops, x = BACKENDS[backend], _tensor(backend, rows)

    def found(x2d) -> list[int]:
        return ops.to_numpy(ops.nonzero_rows(x2d)).tolist()

    assert found(x) == [1, 3, 4, 6]
    assert found(_tensor(backend, rows[:, ::2].copy())) == [3, 4]
    if backend != "tensorflow":  # a strided view (TensorFlow has none)
        assert found(x[:, 1::2]) == [1, 6]
    assert found(_tensor(backend, np.zeros((4, 0), dtype))) == []


def _nonfinite_error(backend):
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.errors.InvalidArgumentError
    return FloatingPointError


def _tensor(backend, a):
    if backend == "numpy":
        return a
    if backend == "torch":
        import torch

        return torch.from_numpy(a)
    import tensorflow as tf

    return tf.constant(a)


#: Lengths around the PyTorch host kernels' block (several blocks, a ragged end) and bucket sizes below,
#: across and above it (one bucket spanning blocks, a last bucket shorter than the others).
ROUNDING_CASES = [(1000, 7), (1000, 1000), (2 * 2**18 + 999, 512), (2 * 2**18 + 999, 2**18 + 3), (2**18 + 5, 2**18 + 5)]


@pytest.mark.parametrize("n,size", ROUNDING_CASES)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_bucket_norms_are_each_runs_norms(backend, n, size):
    import numpy as np

    ops = BACKENDS[backend]
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    buckets = [x[a:a + size].astype(np.float64) for a in range(0, n, size)]
    for order, expected in ((1, [np.abs(b).sum() for b in buckets]), (2, [np.sqrt((b * b).sum()) for b in buckets]),
                            (np.inf, [np.abs(b).max() for b in buckets])):
        got = ops.to_numpy(ops.bucket_norms(_tensor(backend, x), size, order))
        np.testing.assert_allclose(got, expected, rtol=1e-4, err_msg=str(order))


@pytest.mark.parametrize("n,size", ROUNDING_CASES)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_stochastic_rounding_is_unbiased_within_its_limit_and_a_function_of_its_seed(backend, n, size):
    import numpy as np

    ops = BACKENDS[backend]
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, n).astype(np.float32)
    scales = rng.uniform(1, 3, -(-n // size)).astype(np.float32)
    y = x * np.repeat(scales, size)[:n]
    draws = [ops.to_numpy(ops.stochastic_round(_tensor(backend, x), _tensor(backend, scales), size, 2, seed, "int8"))
             for seed in range(40)]
    assert all(d.dtype == np.int8 and d.shape == (n,) for d in draws)
    assert all(np.array_equal(d, np.floor(y) + (d > np.floor(y))) for d in draws)  # one of the two neighbours...
    assert min(d.min() for d in draws) >= -2 and max(d.max() for d in draws) <= 2  # ... clipped to the limit
    clipped = np.clip(y, -2, 2)
    mean = np.mean(draws, axis=0)
    # the mean of 40 draws of a coordinate has a standard deviation of at most 0.5 / sqrt(40) = 0.079;
    # over all coordinates the mean error is far smaller: 0.5 / sqrt(40 n)
    assert abs(np.mean(mean - clipped)) < 5 * 0.5 / np.sqrt(40 * n)
    assert np.max(np.abs(mean - clipped)) < 0.8
    again = ops.to_numpy(ops.stochastic_round(_tensor(backend, x), _tensor(backend, scales), size, 2, 0, "int8"))
    assert np.array_equal(again, draws[0]) and not np.array_equal(draws[0], draws[1])


@pytest.mark.parametrize("n,size", ROUNDING_CASES)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_scaled_sum_adds_each_ranks_codes_times_their_scales(backend, n, size):
    import numpy as np

    ops = BACKENDS[backend]
    rng = np.random.default_rng(3)
    codes = rng.integers(-127, 128, (3, n)).astype(np.int8)
    scales = rng.uniform(-1, 1, (3, -(-n // size))).astype(np.float32)
    expected = (codes * np.repeat(scales, size, axis=1)[:, :n].astype(np.float64)).sum(axis=0)
    got = ops.scaled_sum(_tensor(backend, codes), _tensor(backend, scales), size)
    np.testing.assert_allclose(ops.to_numpy(got), expected, rtol=1e-5, atol=1e-4)
    if backend != "tensorflow":
        out = ops.zeros(n, "float32", _tensor(backend, scales)) + 7
        assert ops.scaled_sum(_tensor(backend, codes), _tensor(backend, scales), size, out) is out
        np.testing.assert_allclose(ops.to_numpy(out), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_axpy_and_zero_at_give_new_tensors_or_write_into_out_even_when_it_is_x(backend):
    import numpy as np

    ops = BACKENDS[backend]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    idx = np.array([0, 5, 11])
    masked = x.copy()
    masked.reshape(-1)[idx] = 0
    given = _tensor(backend, x.copy())
    np.testing.assert_allclose(ops.to_numpy(ops.axpy(0.9, given, _tensor(backend, y))), 0.9 * x + y, rtol=1e-6)
    np.testing.assert_array_equal(ops.to_numpy(ops.zero_at(given, _tensor(backend, idx))), masked)
    np.testing.assert_array_equal(ops.to_numpy(given), x)  # new tensors: x as it was
    if backend == "tensorflow":
        return
    assert ops.axpy(0.9, given, _tensor(backend, y), given) is given
    np.testing.assert_allclose(ops.to_numpy(given), 0.9 * x + y, rtol=1e-6)
    expected = (0.9 * x + y).reshape(-1)
    expected[idx] = 0
    assert ops.zero_at(given, _tensor(backend, idx), given) is given
    np.testing.assert_allclose(ops.to_numpy(given).reshape(-1), expected, rtol=1e-6)
