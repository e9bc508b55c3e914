"""Every compressor and residual store on CUDA tensors, against the same run on the CPU (one process, no
Horovod; skipped without CUDA).

Deterministic methods must agree with the CPU: whatever is integer (indices,
bitmaps, packed signs, hashed buckets) bit for bit, sparse payloads as the same
(index, value) pairs (top-k's order is unspecified), floats to float tolerance
(CUDA's ``index_add_`` adds in any order). Seeded methods draw from the CUDA
generator, so they are compared by what they must keep: the same result for the
same seed on CUDA, and an error like the CPU run's. Every message and result
must live on the GPU. The last test prints the codec table of
``hvdsketch bench compressors --device cuda`` (codec time against one copy of
the gradient on the device); it asserts nothing about time.

Run: ``python -m pytest -s tests/gpu``.
"""
import numpy as np
import pytest
import torch

from hvdsketch.compress import RowSparse, TensorContext, create
from hvdsketch.compress.support import values_of
from hvdsketch.exchange.flight import run_local
from hvdsketch.lab.bench.compressors import gradient
from hvdsketch.lab.cli import main
from hvdsketch.memory import create as create_memory

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

DETERMINISTIC = ["none", "fp16", "fp16:dtype=bfloat16", "topk:ratio=0.01", "sketch", "sketch:density=0.1,rows=3",
                 "sketch:ratio=0.05", "efsignsgd", "dgc:ratio=0.01,sample=1,momentum=0"]
SEEDED = ["randomk:ratio=0.01", "qsgd", "terngrad", "dgc:ratio=0.01", "powersgd:rank=2"]
STORES = ["fp32", "fp16", "bf16", "topk:ratio=0.05", "sketch:ratio=0.2", "shared", "offload"]


def inputs():
    """A row-sparse-looking matrix, a vector whose last sketch block is partial, and a RowSparse gradient."""
    matrix = gradient(200_000, 250, 0.05, seed=1)
    vector = np.random.default_rng(2).standard_normal(10_007).astype(np.float32)
    vector[:5000] = 0
    rows = np.sort(np.random.default_rng(3).choice(2000, 60, replace=False))
    values = np.random.default_rng(4).standard_normal((60, 16)).astype(np.float32)
    return {"matrix": matrix, "vector": vector, "rows": (rows, values, (2000, 16))}


def on(device, value):
    if isinstance(value, tuple):
        rows, values, shape = value
        return RowSparse(torch.from_numpy(rows).to(device), torch.from_numpy(values).to(device), shape)
    return torch.from_numpy(value).to(device)


def taken(flag, tensor):
    """``tensor`` as the exchanger hands it to ``flag``'s compressor (row-sparse only to those that take it)."""
    return tensor.to_dense() if isinstance(tensor, RowSparse) and not create(flag).row_sparse else tensor


def host(x):
    """``x`` in numpy (bfloat16, which numpy lacks, as its bits: compared exactly)."""
    x = x.detach().cpu()
    return (x.view(torch.int16) if x.dtype == torch.bfloat16 else x).numpy()


def run(flag, tensor, name="g"):
    shape = tensor.dense_shape if isinstance(tensor, RowSparse) else tuple(tensor.shape)
    return run_local(create(flag), tensor, TensorContext(name, shape, 3, 1))


def as_pairs(messages):
    """Each round's messages as numpy arrays, an (int64 indices, values) allgather pair sorted by index."""
    out = [host(m.tensor) for m in messages]
    if (len(out) == 2 and messages[0].op == messages[1].op == "allgather" and out[0].dtype == np.int64
            and out[0].shape == out[1].shape):
        order = np.argsort(out[0], kind="stable")
        out = [out[0][order], out[1][order]]
    return out


def assert_same(cpu, cuda, what):
    assert cpu.dtype == cuda.dtype and cpu.shape == cuda.shape, what
    if np.issubdtype(cpu.dtype, np.integer) or cpu.dtype == bool:
        np.testing.assert_array_equal(cuda, cpu, err_msg=what)
    else:
        scale = max(1.0, float(np.abs(cpu.astype(np.float64)).max(initial=0)))
        np.testing.assert_allclose(cuda.astype(np.float64), cpu.astype(np.float64), rtol=1e-5, atol=1e-5 * scale,
                                   err_msg=what)


def assert_on_gpu(result, rounds):
    for messages in rounds:
        assert all(m.tensor.is_cuda for m in messages)
    assert values_of(result).is_cuda
    if isinstance(result, RowSparse):
        assert result.indices.is_cuda


def dense(result):
    return host(result.to_dense() if isinstance(result, RowSparse) else result)


@pytest.mark.parametrize("kind", ["matrix", "vector", "rows"])
@pytest.mark.parametrize("flag", DETERMINISTIC)
def test_deterministic_methods_agree_with_the_cpu(flag, kind):
    cpu_result, cpu_rounds = run(flag, taken(flag, on("cpu", inputs()[kind])))
    result, rounds = run(flag, taken(flag, on("cuda", inputs()[kind])))
    assert_on_gpu(result, rounds)
    assert len(rounds) == len(cpu_rounds)
    for r, (cpu_messages, messages) in enumerate(zip(cpu_rounds, rounds)):
        assert [m.op for m in messages] == [m.op for m in cpu_messages]
        for i, (a, b) in enumerate(zip(as_pairs(cpu_messages), as_pairs(messages))):
            assert_same(a, b, f"{flag} {kind}: round {r} message {i}")
    if isinstance(cpu_result, RowSparse):
        assert isinstance(result, RowSparse)
        np.testing.assert_array_equal(host(result.indices), host(cpu_result.indices))
    assert_same(dense(cpu_result), dense(result), f"{flag} {kind}: result")


@pytest.mark.parametrize("flag", SEEDED)
def test_seeded_methods_repeat_on_the_gpu_and_lose_what_they_lose_on_the_cpu(flag):
    g = inputs()["matrix"]
    truth = np.linalg.norm(g)
    result, rounds = run(flag, on("cuda", g))
    assert_on_gpu(result, rounds)
    again, _ = run(flag, on("cuda", g))
    np.testing.assert_array_equal(host(again), host(result))
    cpu_error = np.linalg.norm(dense(run(flag, on("cpu", g))[0]) - g) / truth
    gpu_error = np.linalg.norm(dense(result) - g) / truth
    assert gpu_error == pytest.approx(cpu_error, rel=0.25, abs=0.02)


@pytest.mark.parametrize("flag", STORES)
def test_stores_round_trip_on_the_gpu_as_on_the_cpu(flag):
    """Three steps of error feedback through a store (a checkpoint between them): the same residuals."""
    e = [inputs()["matrix"] * (t + 1) for t in range(3)]
    out = {}
    for device in ("cpu", "cuda"):
        memory, backs = create_memory(flag), []
        for t, residual in enumerate(e):
            if t == 2:
                state = memory.state_dict()
                memory = create_memory(flag)
                memory.load_state_dict(state)
            g = on(device, residual)
            back = memory.compensate("w", torch.zeros_like(g))
            assert back.device == g.device
            backs.append(host(back))
            memory.update("w", g)
        for slot, state in memory._state.items():
            expected = "cpu" if memory.store("w").host else "cuda"
            assert all(v.device.type == expected for v in state.values()), slot
        out[device] = backs
    for t, (a, b) in enumerate(zip(out["cpu"], out["cuda"])):
        assert_same(a, b, f"{flag}: step {t}")


def test_codec_time_against_a_device_copy(capsys):
    assert main(["bench", "compressors", "--device", "cuda", "--numel", "10000000", "--width", "250",
                 "--density", "0.01", "--repeats", "5"]) == 0
    table = capsys.readouterr().out
    with capsys.disabled():
        print("\n" + table)
    assert "x copy" in table
