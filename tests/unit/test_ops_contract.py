"""The three array back-ends implement :class:`hvdsketch.ops.contract.Ops`, nothing more, nothing less;
and TensorFlow's creating functions place what they make on the device of the tensor they are like."""
import inspect
import subprocess
import sys
import textwrap
import types

import pytest

from hvdsketch.ops import contract, numpy as np_ops, tensorflow as tf_ops, torch as torch_ops

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
