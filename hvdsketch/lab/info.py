"""Versions of hvdsketch and its stack, what Horovod was built with, and this process's rank."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
from importlib import metadata


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _open_mpi() -> str:
    try:
        out = subprocess.run(["ompi_info", "--version"], capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0].split()[-1] if out else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "not found"


def _horovod_build() -> dict[str, list[str]]:
    """Horovod's own probes (each framework checked in a subprocess, as ``horovodrun --check-build``)."""
    util = importlib.import_module("horovod.common.util")
    frameworks = {"TensorFlow": "horovod.tensorflow", "PyTorch": "horovod.torch", "MXNet": "horovod.mxnet"}
    built = [name for name, ext in frameworks.items() if util.extension_available(ext.split(".")[1])]
    controllers = [name for name, probe in (("MPI", util.mpi_built), ("Gloo", util.gloo_built)) if probe()]
    operations = [name for name, probe in (("NCCL", util.nccl_built), ("DDL", util.ddl_built),
                                           ("CCL", util.ccl_built)) if probe()]
    return {"frameworks": built, "controllers": controllers, "tensor_operations": operations + controllers}


def collect() -> dict:
    env = os.environ
    rank = env.get("OMPI_COMM_WORLD_RANK", env.get("HOROVOD_RANK", env.get("PMI_RANK")))
    size = env.get("OMPI_COMM_WORLD_SIZE", env.get("HOROVOD_SIZE", env.get("PMI_SIZE")))
    info = {
        "versions": {"hvdsketch": _version("hvdsketch"), "horovod": _version("horovod"),
                     "torch": _version("torch"), "tensorflow": _version("tensorflow-cpu"),
                     "tf-keras": _version("tf-keras"), "mpi4py": _version("mpi4py"),
                     "open-mpi": _open_mpi()},
        "rank": None if rank is None else int(rank),
        "size": None if size is None else int(size),
    }
    try:
        info["horovod_build"] = _horovod_build()
    except ImportError as err:
        info["horovod_build"] = {"error": str(err)}
    return info


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for name, version in info["versions"].items():
        print(f"{name:<12} {version}")
    for kind, items in info["horovod_build"].items():
        print(f"{kind:<12} {', '.join(items) if isinstance(items, list) else items}")
    if info["size"] is not None:
        print(f"{'rank':<12} {info['rank']} of {info['size']}")
    return 0
