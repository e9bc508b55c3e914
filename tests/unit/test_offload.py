"""The ``offload`` store keeps residuals in host memory: measured where its tensors are, on a stand-in device.

On a CPU-only machine the gradient's device is the host, so no test there can tell
"kept on the host" from "kept on the gradient's device". PyTorch's fake tensors
(``FakeTensorMode``) stand in for an accelerator: they claim a CUDA device
without one, and every op keeps the device it would have on a GPU. The residual
bytes on the gradient's device and on the host are measured from each state
tensor's ``.device`` and must be what ``Memory.nbytes()`` and ``host_nbytes()``
report: ``offload`` keeping the residual on the gradient's device, or another
store moving it to the host, fails.
"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from hvdsketch.memory import create


@pytest.mark.parametrize("flag", ["fp32", "offload"])
def test_residual_bytes_are_on_the_device_the_memory_reports(flag):
    with FakeTensorMode():
        gradient = torch.empty(64, 32, device="cuda")
        memory = create(flag)
        memory.update("w", gradient)
        compensated = memory.compensate("w", gradient)  # back on the gradient's device
        memory.update("w", compensated)
        held = [v for state in memory._state.values() for v in state.values() if isinstance(v, torch.Tensor)]
        on_device = sum(v.numel() * v.element_size() for v in held if v.device == gradient.device)
        on_host = sum(v.numel() * v.element_size() for v in held if v.device == torch.device("cpu"))
        assert compensated.device == gradient.device
        assert (memory.nbytes(), memory.host_nbytes()) == (on_device, on_host)
    assert (on_host > 0, on_device > 0) == ((True, False) if flag == "offload" else (False, True))
