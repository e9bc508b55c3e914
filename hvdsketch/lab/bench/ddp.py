"""The peers users would run instead of hvdsketch: PyTorch DDP over gloo, dense or with PowerSGD.

::

    mpirun -np 2 python -m hvdsketch.lab.bench.ddp --config configs/lstm.yaml --hook powersgd --rank 4 \\
        --steps-per-epoch 60 --out runs/
    launch/cluster.sh --rate 1gbit -np 2 -- python -m hvdsketch.lab.bench.ddp --config configs/lstm.yaml

It trains the same workload (:mod:`hvdsketch.lab.workloads`) from the same YAML
config (optimizer, learning rate, clipping, epochs, steps) through the same
training loop as ``hvdsketch train`` (:func:`hvdsketch.lab.train_torch.fit`), with
``torch.nn.parallel.DistributedDataParallel`` averaging the gradients during
the backward pass, and writes the same JSON record with ``path: ddp``, so the
benchmark harness puts both side by side.

- ``--hook none``: DDP's own bucketed allreduce.
- ``--hook powersgd``: ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``
  (Vogels et al., NeurIPS 2019) at ``--rank``, with error feedback and warm
  start, dense for the first ``--start-iter`` steps (DDP's minimum is 2), matrices
  compressed where ``n m / ((n + m) r) >= 2`` (the hook's own rule), vectors
  allreduced as they are.
- ``--hook hvdsketch``: hvdsketch's own hook (:mod:`hvdsketch.torch.ddp`) with the
  config's ``compression`` and ``memory`` (``auto`` included), sparse gradients kept
  sparse (the workload's ``sparse`` option as the config has it), DDP's default
  buckets (25 MB) unless ``--bucket-cap-mb`` says otherwise, so exchanges start
  while backward goes on; bytes as the hook's report counts them. ``--collectives
  mpi``: the hook's messages over hvdsketch's MPI layer instead of gloo.

With gloo the PowerSGD hook needs all gradients in one bucket (with several,
gloo aborted on a size mismatch here), so the bucket holds the whole model by
default, which also means the allreduce starts after the backward pass, as
hvdsketch's does. PyTorch's PowerSGD hook takes no sparse gradients, so with ``none`` and ``powersgd`` a
workload with a ``sparse`` option (the LSTM's embedding) runs with ``sparse=false``; its
gradient is then the dense tensor hvdsketch's dense allreduce also sends.

Ranks and world size come from the launcher (Open MPI's ``OMPI_COMM_WORLD_*``,
``horovodrun``'s ``HOROVOD_*``, or ``RANK``/``WORLD_SIZE``); the rendezvous is a
TCP store on ``MASTER_ADDR`` (default 127.0.0.1) and ``MASTER_PORT`` (default
derived from the MPI job, so concurrent jobs do not collide), and gloo talks
over the loopback (``GLOO_SOCKET_IFNAME=lo``), inside ``launch/cluster.sh``'s
shaped namespace too. Bytes per step are counted by the ring formula: the dense
buckets, and the hook's own count of what it compressed (P and Q) and not.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

from hvdsketch import spec
from hvdsketch.collectives.stats import ring_allreduce_bytes

HOOKS = ("none", "powersgd", "hvdsketch")
#: Environment variables naming the rank and the world size, by launcher.
LAUNCHERS = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
             ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE"),
             ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"))
#: DDP's own default bucket size (``bucket_cap_mb``), which hvdsketch's hook runs with.
DDP_BUCKET_MB = 25.0
#: How long a rank waits for the others: at the rendezvous, in a collective, and at the exit.
TIMEOUT = datetime.timedelta(seconds=300)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the YAML config hvdsketch train takes")
    parser.add_argument("--workload", help="workload flag, overrides the config's")
    parser.add_argument("--hook", default="powersgd", help="DDP communication hook: none, powersgd (options "
                        "as in a flag, powersgd:rank=4,start_iter=2, or as --rank / --start-iter) or hvdsketch "
                        "(the config's compression and memory)")
    parser.add_argument("--rank", type=int, default=4, help="PowerSGD's matrix approximation rank")
    parser.add_argument("--start-iter", type=int, default=2, help="PowerSGD starts after this many dense steps")
    parser.add_argument("--collectives", choices=("torch", "mpi"), default="torch",
                        help="--hook hvdsketch: its collectives, torch.distributed's (gloo) or hvdsketch's MPI layer")
    parser.add_argument("--bucket-cap-mb", type=float, help="DDP bucket size (default: the whole model)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--steps-per-epoch", type=int, help="cap the steps of each epoch (quick runs)")
    parser.add_argument("--out", help="folder for the JSON record (default: the config's, runs/)")


def launch_env() -> tuple[int, int, int]:
    """``(rank, size, local size)`` from the launcher's environment."""
    for rank, size, local in LAUNCHERS:
        if rank in os.environ and size in os.environ:
            n = int(os.environ[size])
            return int(os.environ[rank]), n, int(os.environ.get(local, n))
    raise RuntimeError("hvdsketch.lab.bench.ddp: no rank in the environment; launch it with mpirun, horovodrun, "
                       "launch/cluster.sh or torchrun (looked for " + ", ".join(r for r, _, _ in LAUNCHERS) + ")")


def parse_hook(args: argparse.Namespace) -> tuple[str, int, int]:
    """``(hook, rank, start_iter)`` from ``--hook`` (a flag whose options override ``--rank`` and
    ``--start-iter``); raises :class:`hvdsketch.spec.SpecError` naming the valid choices."""
    hook = spec.Spec.parse(args.hook)
    if hook.name not in HOOKS:
        raise spec.SpecError(f"unknown hook {hook.name!r}; valid: {', '.join(HOOKS)}")
    unknown = sorted(set(hook.options) - ({"rank", "start_iter"} if hook.name == "powersgd" else set()))
    if unknown:
        raise spec.SpecError(f"unknown option(s) {', '.join(unknown)} for hook {hook.name!r}; valid: "
                             f"{'rank, start_iter' if hook.name == 'powersgd' else '(none)'}")
    try:
        rank, start = int(hook.options.get("rank", args.rank)), int(hook.options.get("start_iter", args.start_iter))
    except ValueError:
        raise spec.SpecError(f"hook {args.hook!r}: rank and start_iter are integers") from None
    if rank < 1 or start < 2:
        raise spec.SpecError(f"hook {args.hook!r}: rank must be >= 1 and start_iter >= 2 (DDP's minimum)")
    return hook.name, rank, start


def dense_workload(flag: str) -> str:
    """The workload flag with ``sparse=false`` where the workload has that option."""
    from hvdsketch.lab.workloads import get

    parsed = spec.Spec.parse(flag)
    if "sparse" not in {f.name for f in dataclasses.fields(get(flag))}:
        return flag
    return str(spec.Spec(parsed.name, {**parsed.options, "sparse": "false"}))


def run(args: argparse.Namespace) -> int:
    from hvdsketch.lab.config import TrainConfig
    from hvdsketch.lab.train import print_summary
    from hvdsketch.lab.workloads import get

    hook, approximation_rank, start_iter = parse_hook(args)
    rank, size, local = launch_env()
    config = TrainConfig.load(args.config, workload=args.workload, epochs=args.epochs,
                              steps_per_epoch=args.steps_per_epoch, out=args.out)
    if hook != "hvdsketch":  # PyTorch's hooks: a dense embedding, no memory
        flag = "none" if hook == "none" else f"powersgd:rank={approximation_rank}"
        config = dataclasses.replace(config, workload=dense_workload(config.workload), compression=flag, memory=None)
    workload = get(config.workload)
    with gloo_group(rank, size):
        record = _train(config, workload, hook, approximation_rank, start_iter, args.bucket_cap_mb, rank, size, local,
                        args.collectives)
    if rank == 0:
        print_summary(record)
        out = Path(config.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{workload.name}-ddp-{hook}-np{size}-{int(time.time())}.json"
        path.write_text(json.dumps(record, indent=2))
        print(f"record: {path}")
    return 0


@contextlib.contextmanager
def gloo_group(rank: int, size: int) -> Iterator[None]:
    """The default process group over gloo for this job's ``rank`` of ``size`` (rendezvous:
    :func:`_store`), torn down on leaving: after a barrier where the block ends normally (no rank
    tears gloo down under another's feet), rank 0, which serves the store, last."""
    import torch.distributed as dist

    store = _store(rank, size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    try:
        yield
        dist.barrier()
    finally:
        _destroy()
    _leave(store, rank, size)


def _store(rank: int, size: int) -> Any:
    """The rendezvous: a TCP store served by rank 0 on ``MASTER_ADDR``:``MASTER_PORT``."""
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", 20000 + int(os.environ.get("OMPI_MCA_ess_base_jobid", 9500)) % 20000))
    return dist.TCPStore(host, port, size, is_master=rank == 0, timeout=TIMEOUT)


def _destroy() -> None:
    """Tear the default process group down, first freeing what refers to it: a DDP model is a
    reference cycle, and one freed at the interpreter's exit, after its gloo group is gone, can abort
    the exit ("terminate called without an active exception")."""
    import torch.distributed as dist

    gc.collect()
    dist.destroy_process_group()


def _leave(store: Any, rank: int, size: int) -> None:
    """Each rank says it has torn its process group down; rank 0, which serves the store, waits
    for all of them before it may exit, so no rank's teardown meets a store or peer already gone."""
    if rank:
        store.set(f"left/{rank}", "1")
    else:
        store.wait([f"left/{r}" for r in range(1, size)], TIMEOUT)


def _train(config: Any, workload: Any, hook: str, approximation_rank: int, start_iter: int,
           bucket_cap_mb: float | None, rank: int, size: int, local: int, collectives: str) -> dict[str, Any]:
    """The run's record; DDP and its hook's state are gone when it returns, before the process
    group is destroyed."""
    import torch

    from hvdsketch.lab.train_torch import Timing, _optimizer, clip, fit, record_of

    torch.set_num_threads(max(1, torch.get_num_threads() // local))
    model = workload.build_model()
    whole = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20 + 1
    bucket_cap_mb = bucket_cap_mb or (DDP_BUCKET_MB if hook == "hvdsketch" else whole)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    state = {"none": lambda: None, "powersgd": lambda: _powersgd(ddp, approximation_rank, start_iter),
             "hvdsketch": lambda: _hvdsketch(ddp, config, collectives)}[hook]()
    optimizer = _optimizer(config, model)

    steps = {"done": 0}

    def step(batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        steps["done"] += 1
        timing = Timing()
        optimizer.zero_grad()
        loss = workload.loss(ddp, batch)
        loss.backward()  # DDP averages the gradients here
        timing.mark("backward")
        clip(config, model)
        optimizer.step()
        return loss, timing.mark("update")

    dense = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)

    def report() -> dict[str, Any]:
        done = steps["done"]
        full = ring_allreduce_bytes(dense, size)
        if hook == "hvdsketch":
            return record_of(state.report())
        if state is None:
            return {"sent": full * done, "dense": full * done, "seconds": {}}
        _, _, compressed = state.compression_stats()  # elements sent in the PowerSGD steps
        itemsize = dense // sum(p.numel() for p in model.parameters() if p.requires_grad)
        sent = full * min(done, state.start_powerSGD_iter) + ring_allreduce_bytes(int(compressed) * itemsize, size)
        return {"sent": sent, "dense": full * done, "seconds": {}}

    record = fit(config, workload, model, step, rank, size, report)
    record["path"] = "ddp"
    record["ddp"] = {"hook": hook, "bucket_cap_mb": bucket_cap_mb, "backend": "gloo",
                     **({"rank": approximation_rank, "start_iter": start_iter} if hook == "powersgd" else {}),
                     **({"collectives": collectives} if hook == "hvdsketch" else {})}
    return record


def _hvdsketch(ddp: Any, config: Any, collectives: str) -> Any:
    """Register hvdsketch's hook with the config's compression and memory over ``collectives``; its
    state (which reports)."""
    from hvdsketch.torch import ddp as hvdsketch_ddp

    state = hvdsketch_ddp.ExchangeState(ddp, compression=config.compression, memory=config.memory,
                                        sparse_as_dense=config.densify, collectives=collectives)
    ddp.register_comm_hook(state, hvdsketch_ddp.exchange_hook)
    return state


def _powersgd(ddp: Any, rank: int, start_iter: int) -> Any:
    """Register DDP's PowerSGD hook; its state (which counts what it compressed)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                        start_powerSGD_iter=start_iter)
    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvdsketch.lab.bench.ddp", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
