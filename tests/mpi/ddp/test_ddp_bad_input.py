"""Bad input to the hook: the same clear error on every rank, never a hang."""
import pytest
import torch.distributed as dist

from hvdsketch.exchange.agreement import AgreementError
from hvdsketch.torch.ddp import ExchangeState, exchange_hook
from tests.mpi.ddp.cases import batches, ddp, loss, model, sgd, train


def test_an_unknown_compressor_is_a_clear_error_on_every_rank():
    wrapped, _ = ddp(model())
    with pytest.raises(ValueError, match="unknown compressor 'skech'.*valid:.*sketch"):
        ExchangeState(wrapped, compression="skech")
    with pytest.raises(ValueError, match="unknown.*'fp33'"):
        ExchangeState(wrapped, compression="sketch", memory="fp33")


def test_collectives_it_cannot_run_are_a_clear_error_on_every_rank():
    wrapped, _ = ddp(model())
    with pytest.raises(ValueError, match="collectives must be 'torch' or 'mpi', got 'nccl'"):
        ExchangeState(wrapped, compression="allgather", collectives="nccl")
    with pytest.raises(ValueError, match="'mpi' averages over every MPI rank; it takes no process_group"):
        ExchangeState(wrapped, compression="allgather", collectives="mpi", process_group=dist.group.WORLD)


def test_named_parameters_that_are_not_pairs_are_a_clear_error():
    module = model()
    with pytest.raises(ValueError, match=r"\(name, parameter\) pairs"):
        ExchangeState(module.parameters())


def test_ranks_running_other_compressions_fail_alike_at_the_first_bucket():
    """The agreement check at the first bucket names the difference on every rank; backward raises."""
    module = model()
    wrapped, _ = ddp(module)
    compression = "topk:ratio=0.1" if dist.get_rank() == 0 else "topk:ratio=0.2"
    wrapped.register_comm_hook(ExchangeState(wrapped, compression=compression), exchange_hook)
    with pytest.raises((AgreementError, RuntimeError), match="compression is topk:ratio=0.1 on rank 0 but "
                                                             "topk:ratio=0.2 on rank 1"):
        loss(wrapped, batches(1)[0]).backward()


def test_ranks_that_differ_in_error_if_nonfinite_fail_alike_at_the_first_bucket():
    """One rank raising where another hands a NaN back would leave the other waiting a step later."""
    module = model()
    wrapped, _ = ddp(module)
    wrapped.register_comm_hook(ExchangeState(wrapped, error_if_nonfinite=dist.get_rank() == 0), exchange_hook)
    with pytest.raises((AgreementError, RuntimeError), match="error_if_nonfinite is True on rank 0 but False"):
        loss(wrapped, batches(1)[0]).backward()


def test_a_parameter_the_state_was_not_given_is_a_clear_error_on_every_rank():
    module = model()
    wrapped = ddp(module)[0]
    wrapped.register_comm_hook(ExchangeState(list(module.named_parameters())[1:]), exchange_hook)
    with pytest.raises((ValueError, RuntimeError), match="was not given"):
        train(wrapped, sgd(module), batches(1))
