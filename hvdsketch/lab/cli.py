"""``hvdsketch info | train | plan | compare | bench {collectives,compressors,train,exchange,linkbound,scaling,latency}``.

Each command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; modules import frameworks inside ``run`` only, so the
CLI starts fast and never loads PyTorch and TensorFlow together.

The command is the lab (``pip install "hvdsketch[lab]"``), but ``pip install hvdsketch`` installs
it too (a package's console scripts cannot depend on an extra): without the lab's packages it
says in one line what to install and exits with status 2.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
from importlib import metadata

COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("hvdsketch.lab.info", "versions, Horovod build, rank and size"),
    "train": ("hvdsketch.lab.train", "train a workload from a YAML config (run under horovodrun)"),
    "plan": ("hvdsketch.lab.plan", "show the residual-memory plan for a config"),
    "compare": ("hvdsketch.lab.compare", "one run's step time and bytes against a dense run's (records of train)"),
}
BENCHMARKS: dict[str, tuple[str, str]] = {
    "collectives": ("hvdsketch.lab.bench.collectives", "sparse collectives against dense allreduce"),
    "compressors": ("hvdsketch.lab.bench.compressors", "ratio, throughput and error of every compressor"),
    "train": ("hvdsketch.lab.bench.train", "training matrix on the emulated cluster"),
    "exchange": ("hvdsketch.lab.bench.exchange", "one tensor's exchange time per entry, on real gradients"),
    "linkbound": ("hvdsketch.lab.bench.linkbound", "bench exchange unshaped, then over links slowed until dense is link-bound"),
    "scaling": ("hvdsketch.lab.bench.scaling", "bytes per rank of sparse allreduces for 2..1024 ranks, measured supports"),
    "latency": ("hvdsketch.lab.bench.latency", "one small collective's round trip over gloo and over MPI (under mpirun)"),
}


def _add(sub: argparse._SubParsersAction, name: str, module: str, help_text: str) -> None:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if not module.startswith(err.name or "\0"):
            raise
        return  # that command is not part of this build
    parser = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip())
    mod.add_arguments(parser)
    parser.set_defaults(run=mod.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hvdsketch", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        _add(sub, name, module, help_text)
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="benchmark", required=True)
    for name, (module, help_text) in BENCHMARKS.items():
        _add(bench, name, module, help_text)
    return parser


def missing_lab() -> list[str]:
    """The distributions of the ``lab`` extra that are not installed, as the installed package's
    metadata lists them (setup.cfg's ``[options.extras_require]``); none where hvdsketch runs from a
    checkout without being installed."""
    try:
        requirements = metadata.requires("hvdsketch") or []
    except metadata.PackageNotFoundError:
        return []
    missing = []
    for requirement in requirements:
        name, _, marker = requirement.partition(";")
        if re.search(r"""extra\s*==\s*["']lab["']""", marker):
            name = re.match(r"[A-Za-z0-9._-]+", name.strip()).group()
            try:
                metadata.distribution(name)
            except metadata.PackageNotFoundError:
                missing.append(name)
    return missing


def main(argv: list[str] | None = None) -> int:
    missing = missing_lab()
    if missing:
        print(f'hvdsketch: this command needs the lab: pip install "hvdsketch[lab]" '
              f"(missing: {', '.join(missing)})", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
