"""The drop-in namespaces (``hvdsketch.torch.Compression``, ``hvdsketch.tensorflow.Compression``):
every compressor by name, a new object at each use in PyTorch and one object per flag in
TensorFlow, a clear error for what Horovod's path cannot carry, and, in TensorFlow, made and counted
anywhere, inside tf.function too."""
import os

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

tf = pytest.importorskip("tensorflow")  # the pinned environment has it; the newest PyTorch's has not
import torch  # noqa: E402

from hvdsketch.compress import REGISTRY, create  # noqa: E402
from hvdsketch.dropin import DropInCompression  # noqa: E402
from hvdsketch.tensorflow import Compression as TFCompression  # noqa: E402
from hvdsketch.torch import Compression as TorchCompression  # noqa: E402

NAMESPACES = {"torch": (TorchCompression, "hvdsketch.torch.DistributedOptimizer"),
              "tensorflow": (TFCompression, "hvdsketch.tensorflow.DistributedGradientTape")}
DROP_IN = {"none", "fp16", "randomk", "sketch"}


def test_the_drop_in_compressors_are_the_ones_expected():
    """If a compressor becomes drop-in (or stops being), the examples' list must follow."""
    assert {name for name in REGISTRY if create(name).one_message().drop_in} == DROP_IN


@pytest.mark.parametrize("framework", NAMESPACES)
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_compressor_is_an_attribute(framework, name):
    namespace, own = NAMESPACES[framework]
    if name in DROP_IN:
        compression = getattr(namespace, name)
        assert isinstance(compression, DropInCompression) and compression.compressor.name == name
        again = [getattr(namespace, name), namespace.from_spec(str(compression.compressor))]
        assert all((made is compression) == (framework == "tensorflow") for made in again)
        assert all(str(made.compressor) == str(compression.compressor) for made in again)
    else:
        with pytest.raises(ValueError, match=f"{own}.*compression='{name}'"):
            getattr(namespace, name)


@pytest.mark.parametrize("framework", NAMESPACES)
def test_options_give_the_compression_of_their_flag(framework):
    namespace, own = NAMESPACES[framework]
    assert str(namespace.sketch.compressor) == "sketch:bitmap=float"  # its one-message form
    assert str(namespace.sketch(error=0.25, rows=3).compressor) == "sketch:rows=3,error=0.25,bitmap=float"
    assert str(namespace.sketch(error=0.25).compressor) == str(namespace.sketch(error=0.25, bitmap="float").compressor)
    assert str(namespace.fp16(dtype="float16").compressor) == str(namespace.fp16.compressor)  # the default, given
    assert namespace.randomk(ratio=0.5).compressor.ratio == 0.5
    assert str(namespace.from_spec("sketch").compressor) == str(namespace.sketch.compressor)  # one-message by flag
    assert namespace.from_spec("sketch:ratio=0.1").compressor.ratio == 0.1
    with pytest.raises(ValueError, match=own):
        namespace.from_spec("topk:ratio=0.1")
    with pytest.raises(ValueError, match="unknown option"):
        namespace.fp16(ratio=2)


def test_tensorflow_gives_one_object_per_flag():
    """Horovod's TensorFlow tape is made in the step and caches its traced allreduce by the
    compression object: one object per flag, whatever the options' spelling, as Horovod's own."""
    assert TFCompression.sketch(error=0.25) is TFCompression.sketch(error=0.25, bitmap="float")
    assert TFCompression.sketch(error=0.25) is not TFCompression.sketch
    assert TFCompression.fp16(dtype="float16") is TFCompression.fp16
    assert TFCompression.from_spec("sketch") is TFCompression.sketch


def test_torch_gives_a_new_object_at_each_use_with_its_own_steps_and_counts():
    """Each ``Compression.x`` given to a Horovod optimizer is that optimizer's own: its steps, its
    tensors' states and its byte counts start afresh, and go on in the object kept."""
    kept = TorchCompression.sketch(error=0.5, density=0.5)
    other = TorchCompression.sketch(error=0.5, density=0.5)
    assert kept is not other and kept.session is not other.session
    for _ in range(3):
        kept.decompress(*kept.compress(torch.ones(10, 4)))
    assert kept.session.step == 2 and other.session.step == 0 and not other.session.states.state_dict()
    report = kept.report()
    assert report["bytes_dense"] == 3 * 160 and 0 < report["bytes_sent"] and other.report()["bytes_dense"] == 0


def test_tensorflow_compression_made_inside_tf_function_counts_every_run():
    """As Horovod's TF2 examples do: the compression named inside a function traced twice (its
    ``first_batch`` argument a Python bool), and one compression first used in the second trace."""
    before = TFCompression.sketch(error=0.75).report()["bytes_dense"]

    @tf.function
    def step(x, first_batch):
        out = []
        for compression in [TFCompression.sketch(error=0.75)] + ([] if first_batch else [TFCompression.fp16]):
            payload, ctx = compression.compress(x)
            out.append(compression.decompress(payload, ctx))
        return out

    x = tf.constant(np.eye(40, dtype=np.float32))
    for i in range(4):
        results = step(x, i == 0)
    np.testing.assert_allclose(results[1].numpy(), np.eye(40), rtol=1e-2)
    assert TFCompression.sketch(error=0.75).report()["bytes_dense"] - before == 4 * 40 * 40 * 4
    assert TFCompression.fp16.report()["bytes_dense"] >= 3 * 40 * 40 * 4
    eager = TFCompression.fp16
    dense = eager.report()["bytes_dense"]
    eager.decompress(*eager.compress(x))
    assert eager.report()["bytes_dense"] == dense + 40 * 40 * 4
