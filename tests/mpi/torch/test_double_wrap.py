"""hvdsketch's DistributedOptimizer over an optimizer already wrapped, by Horovod or by hvdsketch: a
clear error naming the fix, before anything is registered (without the check, Python's own
``TypeError: _DistributedOptimizer.__init__() missing 2 required positional arguments``)."""
import pytest
import torch

import hvdsketch.torch


def wrapped_by(hvd, whose: str, module: torch.nn.Module) -> torch.optim.Optimizer:
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    if whose == "hvdsketch":
        return hvdsketch.torch.DistributedOptimizer(optimizer, named_parameters=module.named_parameters())
    if whose == "horovod-adasum":
        return hvd.DistributedOptimizer(optimizer, named_parameters=module.named_parameters(), op=hvd.Adasum)
    return hvd.DistributedOptimizer(optimizer, named_parameters=module.named_parameters())


@pytest.mark.parametrize("whose, named", [("horovod", "hvd.DistributedOptimizer"),
                                          ("horovod-adasum", "hvd.DistributedOptimizer"),
                                          ("hvdsketch", "hvdsketch.torch.DistributedOptimizer")])
def test_an_optimizer_wrapped_already_is_a_clear_error(hvd, whose, named):
    module = torch.nn.Linear(3, 2)
    inner = wrapped_by(hvd, whose, module)
    with pytest.raises(TypeError, match=rf"an optimizer that {named} already wrapped .*averaged twice; wrap the "
                                        r"torch.optim optimizer once, with hvdsketch.torch.DistributedOptimizer alone"):
        hvdsketch.torch.DistributedOptimizer(inner, named_parameters=module.named_parameters(), compression="topk:ratio=0.5")
    # the inner optimizer still trains as it did: the refused wrap registered nothing
    module(torch.ones(2, 3)).sum().backward()
    inner.step()
