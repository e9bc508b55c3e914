"""``auto`` for FSDP: each module's reduce-scatter method priced from the link (every rank runs these)."""
import torch

from tests.mpi.fsdp.cases import adam, batches, local, model, sharded, step

SLOW = "auto:warmup=1,bandwidth=1mbit,latency=100us"
FAST = "auto:warmup=1,bandwidth=100gbit,latency=10ms"


def decided(flag: str, steps: int = 3):
    """The method of each module after ``steps`` steps of batches drawing from 8 of the 96 words."""
    module, reduction = sharded(model(), flag)
    optimizer = adam(module)
    for batch in batches(steps, rows=8):
        step(module, optimizer, batch)
    table = reduction.report()["assignment"] or []  # None for a single method
    return {row["tensor"]: row["compressor"] for row in table}, local(module)


def test_on_a_slow_link_each_module_gets_a_method_that_sends_less():
    """The embedding, whose gradient touches few rows, its rows; the dense modules a 16-bit or
    quantized transport; the same choice on every rank (rank 0's)."""
    choice, _ = decided(SLOW)
    assert set(choice) == {"embed", "blocks.0", "blocks.1", "<root>"}
    assert choice["embed"] == "rows"
    assert all(choice[name] in ("fp16:dtype=bfloat16", "quantize") for name in ("blocks.0", "blocks.1", "<root>"))


def test_where_latency_dominates_fsdps_own_reduce_scatter_stays():
    choice, trained = decided(FAST)
    assert set(choice.values()) == {"none"}
    _, reference = decided("none")
    assert torch.equal(trained, reference)  # and it is FSDP's own, bit for bit
