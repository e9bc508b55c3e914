"""Build hvdsketch's documentation site: ``python docs/build.py OUT`` writes its HTML into OUT.

Two Sphinx runs, warnings as errors, because one process must not import ``horovod.torch`` and
``horovod.tensorflow`` together: the TensorFlow run builds the pages of :data:`FRAMEWORK_PAGES`
marked ``tensorflow`` (importing TensorFlow), the main run every other page (importing PyTorch).
Each run reads every page and sees the other run's pages as stubs of their titles (conf.py). The
TensorFlow run goes first, into a temporary folder; the main run, into OUT, resolves references to
the TensorFlow API through that run's inventory; then the TensorFlow pages replace their stubs in
OUT, and OUT's ``objects.inv`` takes their entries, so it lists the whole API. Exits with the first
failing run's status.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

DOCS = Path(__file__).resolve().parent
#: The pages that import a framework, by the run that builds each.
FRAMEWORK_PAGES = {"api/torch": "main", "api/ddp": "main", "api/fsdp": "main", "api/tensorflow": "tensorflow"}


def sphinx_command(out: Path, doctrees: Path, *options: str) -> list[str]:
    """One Sphinx run over docs/ into ``out``: nitpicky, warnings as errors, every page read anew."""
    return [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", "-n", "-E",
            "-d", str(doctrees), *options, str(DOCS), str(out)]


def sphinx(out: Path, doctrees: Path, *options: str, env: dict[str, str] | None = None) -> int:
    """Run :func:`sphinx_command`; its exit status."""
    return subprocess.run(sphinx_command(out, doctrees, *options), env={**os.environ, **(env or {})}).returncode


def read_inventory(path: Path) -> tuple[bytes, list[bytes]]:
    """A Sphinx inventory (version 2): its header and its entries."""
    data = path.read_bytes()
    cut = 0
    for _ in range(4):  # the header: version, project, version, compression note
        cut = data.index(b"\n", cut) + 1
    return data[:cut], zlib.decompress(data[cut:]).splitlines()


def merge_inventory(main: Path, other: Path, pages: list[str]) -> None:
    """Add to ``main``'s inventory the objects of ``other``'s that are described on ``pages`` (the
    main run's stubs of those pages describe none)."""
    header, ours = read_inventory(main)
    _, theirs = read_inventory(other)
    uris = {f"{page}.html".encode() for page in pages}
    # an entry: name, domain:role, priority, uri (with its #anchor), display name; spaces between
    added = [e for e in theirs if not e.split(b" ")[1].startswith(b"std:") and e.split(b" ")[3].split(b"#")[0] in uris]
    main.write_bytes(header + zlib.compress(b"\n".join(ours + added) + b"\n"))


def build(out: Path) -> int:
    """Both runs, the TensorFlow pages copied over their stubs; 0 where both succeeded."""
    out.mkdir(parents=True, exist_ok=True)
    pages = [page for page, run in FRAMEWORK_PAGES.items() if run == "tensorflow"]
    with tempfile.TemporaryDirectory(prefix="hvdsketch-docs-") as tmp:
        tensorflow = Path(tmp) / "tensorflow"
        status = sphinx(tensorflow, Path(tmp) / "doctrees-tensorflow", "-t", "tensorflow")
        if status:
            return status
        inventory = tensorflow / "objects.inv"
        status = sphinx(out, Path(tmp) / "doctrees", env={"HVDSKETCH_DOCS_TENSORFLOW_INVENTORY": str(inventory)})
        if status:
            return status
        for page in pages:
            shutil.copyfile(tensorflow / f"{page}.html", out / f"{page}.html")
        merge_inventory(out / "objects.inv", inventory, pages)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} OUT  (e.g. docs/_build/html)")
    sys.exit(build(Path(sys.argv[1])))
