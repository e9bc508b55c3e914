"""Residual stores keep their whole state as tensors of the residual's back-end on its device: a scale
or a choice kept as a Python number would have to be read from the device every step (a host sync)."""
import numpy as np
import pytest
import torch

from hvdsketch.memory import create


def residual(seed, shape=(30, 8), scale=1.0):
    return torch.from_numpy(scale * np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("flag", ["fp32", "fp16", "bf16", "topk:ratio=0.2", "shared", "offload"])
def test_state_is_tensors_only(flag):
    memory = create(flag)
    memory.update("a", residual(0))
    memory.update("b", residual(1))
    memory.compensate("a", residual(2))
    memory.update("a", residual(3))
    for slot, state in memory._state.items():
        for key, value in state.items():
            assert isinstance(value, torch.Tensor), f"{flag}: {slot}[{key!r}] is a {type(value).__name__}"
            assert value.device.type == "cpu"


@pytest.mark.parametrize("flag", ["fp16", "bf16"])
def test_half_store_scale_is_a_power_of_two_on_the_device_and_one_where_the_norm_is_not_usable(flag):
    memory = create(flag)
    for name, e in {"big": residual(4, scale=1e6), "zero": torch.zeros(5), "inf": torch.tensor([1.0, np.inf])}.items():
        memory.update(name, e)
    scales = {name: memory._state[name]["scale"] for name in ("big", "zero", "inf")}
    assert all(s.dtype == torch.float32 and s.dim() == 0 for s in scales.values())
    norm = float(torch.linalg.vector_norm(residual(4, scale=1e6).double()))
    assert float(scales["big"]) == 2.0 ** (np.ceil(np.log2(norm)) - 15)
    assert float(scales["zero"]) == 1.0 and float(scales["inf"]) == 1.0
    assert torch.equal(memory.compensate("zero", torch.zeros(5)), torch.zeros(5))


def test_shared_buffer_choices_survive_a_checkpoint():
    memory = create("shared")
    memory.update("a", residual(5))
    memory.update("b", 3 * residual(6))  # more energy: b owns the buffer
    resumed = create("shared")
    resumed.load_state_dict(memory.state_dict())
    zero = torch.zeros(30, 8)
    assert torch.equal(resumed.compensate("a", zero), zero)
    assert torch.equal(resumed.compensate("b", zero), 3 * residual(6))
