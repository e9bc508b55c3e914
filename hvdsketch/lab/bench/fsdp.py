"""FSDP2 side by side: its own reduce-scatter in float32 or bfloat16, and hvdsketch's front end.

::

    mpirun -np 2 python -m hvdsketch.lab.bench.fsdp --config configs/transformer.yaml --reduce bf16
    launch/cluster.sh --rate 1gbit -np 4 -- python -m hvdsketch.lab.bench.fsdp --config configs/transformer.yaml \\
        --reduce hvdsketch

It trains a workload with a ``shard`` method (the transformer LM, :mod:`hvdsketch.lab.workloads.transformer`)
under ``fully_shard`` over gloo, from the same YAML config (optimizer, learning rate, epochs, steps)
through the same training loop as ``hvdsketch train`` (:func:`hvdsketch.lab.train_torch.fit`, every
rank validating, since a sharded model's forward is collective), and writes the same JSON record with
``path: fsdp``:

- ``--reduce fp32``: FSDP2's own reduce-scatter of float32 gradients;
- ``--reduce bf16``: FSDP2's own in bfloat16 (``MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)``:
  half the bytes, partial sums rounded to bfloat16), the 16-bit baseline;
- ``--reduce hvdsketch``: :func:`hvdsketch.torch.fsdp.compress` with the config's ``compression``
  and ``memory``.

Parameters stay float32. ``--reshard-after-forward`` frees each module's gathered parameters after its
forward, as FSDP2 does by default, so backward gathers them again; without it (the benchmark's
setting) they stay gathered through backward, one all-gather a module a step. FSDP's own
reduce-scatters run through a custom reduce-scatter that calls what FSDP calls
(``reduce_scatter_single``) and times it, so every entry's step splits into compute (forward and
backward with FSDP's all-gathers), codec, wait (the reduce-scatters) and update. Bytes per step: what
each rank's reduce-scatters sent (a ring's ``(N - 1) / N``), against FSDP's float32 reduce-scatter of
the same gradients. Launch, rendezvous and teardown as :mod:`hvdsketch.lab.bench.ddp`'s.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import yaml

from hvdsketch import spec
from hvdsketch.collectives.stats import reduce_scatter_bytes
from hvdsketch.lab.bench.ddp import TIMEOUT, _destroy, _leave, _store, launch_env
from hvdsketch.policy.scatter import create as scatter_policy

REDUCTIONS = ("fp32", "bf16", "hvdsketch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the YAML config hvdsketch train takes")
    parser.add_argument("--workload", help="workload flag, overrides the config's")
    parser.add_argument("--reduce", choices=REDUCTIONS, default="hvdsketch",
                        help="FSDP2's own reduce-scatter in float32 or bfloat16, or hvdsketch's (the config's "
                             "compression and memory)")
    parser.add_argument("--reshard-after-forward", action="store_true",
                        help="free gathered parameters after each forward (FSDP2's default; backward gathers again)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--steps-per-epoch", type=int, help="cap the steps of each epoch (quick runs)")
    parser.add_argument("--out", help="folder for the JSON record (default: the config's, runs/)")


class _Counted:
    """FSDP's own reduce-scatter (what its default calls), its seconds and bytes counted."""

    def __init__(self, size: int) -> None:
        self.size, self.seconds, self.sent, self.dense = size, 0.0, 0, 0

    def comm(self) -> Any:
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

        counted = self

        class CountedReduceScatter(ReduceScatter):
            def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
                return torch.empty(*size, dtype=dtype, device=device)

            def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                         async_op: bool = False) -> Any:
                began = time.perf_counter()
                work = dist.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
                counted.seconds += time.perf_counter() - began
                counted.sent += reduce_scatter_bytes(input_tensor.numel() * input_tensor.element_size(), counted.size)
                counted.dense += reduce_scatter_bytes(input_tensor.numel() * 4, counted.size)
                return work

        return CountedReduceScatter()

    def report(self) -> dict[str, Any]:
        return {"sent": self.sent, "dense": self.dense, "seconds": {"finish": self.seconds, "codec": 0.0}}


def _train(config: Any, flag: str, workload: Any, reduce: str, reshard: bool, rank: int, size: int,
           local: int) -> dict[str, Any]:
    """The run's record (``flag``: hvdsketch's reduce-scatter method); the model and hvdsketch's state
    are gone when it returns."""
    import torch
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

    import hvdsketch.torch.fsdp
    from hvdsketch.lab.train_torch import Timing, _optimizer, fit

    torch.set_num_threads(max(1, torch.get_num_threads() // local))
    model = workload.build_model()
    policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16 if reduce == "bf16" else None)
    workload.shard(model, mp_policy=policy, reshard_after_forward=reshard)
    if reduce == "hvdsketch":
        reduction = hvdsketch.torch.fsdp.compress(model, flag, config.memory)

        def report() -> dict[str, Any]:
            r = reduction.report()
            return {"sent": r["bytes_sent"], "dense": r["bytes_dense_reduce_scatter"], "seconds": r["seconds"],
                    "assignment": r["assignment"], "residual_bytes": r["residual_bytes"]}
    else:
        counted = _Counted(size)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_reduce_scatter(counted.comm())
        report = counted.report
    optimizer = _optimizer(config, model)

    def step(batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        timing = Timing()
        optimizer.zero_grad()
        loss = workload.loss(model, batch)
        loss.backward()  # FSDP reduce-scatters every module's gradients here
        timing.mark("backward")
        optimizer.step()
        return loss, timing.mark("update")

    record = fit(config, workload, model, step, rank, size, report, sharded=True)
    record["path"], record["compression"] = "fsdp", flag
    record["config"]["compression"] = flag
    record["fsdp"] = {"reduce": reduce, "reshard_after_forward": reshard, "backend": "gloo",
                      "param_dtype": "float32", "reduce_dtype": "bfloat16" if reduce == "bf16" else "float32"}
    return record


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import torch.distributed as dist

    from hvdsketch.lab.config import TrainConfig
    from hvdsketch.lab.train import print_summary
    from hvdsketch.lab.workloads import get

    rank, size, local = launch_env()
    # the config's compression is a reduce-scatter method's flag, which hvdsketch train's check does not know
    raw = yaml.safe_load(Path(args.config).read_text()) or {}
    flag = str(spec.resolve(None, None, raw)) if args.reduce == "hvdsketch" else "none"
    scatter_policy(flag)  # a bad flag raises its SpecError here, on every rank
    config = TrainConfig.load(args.config, compression="none", workload=args.workload, epochs=args.epochs,
                              steps_per_epoch=args.steps_per_epoch, out=args.out)
    if args.reduce != "hvdsketch":  # FSDP's own: no memory
        config = dataclasses.replace(config, memory=None)
    workload = get(config.workload)
    if not hasattr(workload, "shard"):
        raise SystemExit(f"hvdsketch.lab.bench.fsdp: workload {workload.name!r} does not say how FSDP2 shards it "
                         f"(no shard method); use transformer")
    store = _store(rank, size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    try:
        record = _train(config, flag, workload, args.reduce, args.reshard_after_forward, rank, size, local)
        dist.barrier()
    finally:
        _destroy()
    _leave(store, rank, size)
    if rank == 0:
        print_summary(record)
        out = Path(config.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{workload.name}-fsdp-{args.reduce}-np{size}-{int(time.time())}.json"
        path.write_text(json.dumps(record, indent=2))
        print(f"record: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvdsketch.lab.bench.fsdp", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
