"""``pip install hvdsketch`` as a user does it: the wheel built from this tree, installed into a fresh
virtual environment without extras, gives the plugin (``import hvdsketch.torch``) and a console
script that says in one line what to install; with ``[lab]`` the console script works.

Offline and quick: the fresh environment sees only the distributions a user would have installed
(PyTorch and Horovod, their own dependencies, then the lab's), each linked from this project's
virtual environment into a folder that a ``.pth`` file puts on its path, so pip finds them installed
and downloads nothing (``--no-index``), and nothing else of the project's environment is visible.
"""
from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Iterable

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import needs

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def run(*cmd: str | Path, **kwargs) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3", "HOME": os.environ.get("HOME", "/tmp")}
    kwargs.setdefault("cwd", "/")  # not the checkout, whose hvdsketch `python -c` would import
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=240, env=env, **kwargs)


def closure(requirements: Iterable[str], extra: str = "") -> set[str]:
    """The installed distributions ``requirements`` (evaluated for ``extra``) need, with everything
    they need in turn; a requirement that this environment lacks too is left out."""
    needed: set[str] = set()
    todo = [(Requirement(r), extra) for r in requirements]
    while todo:
        requirement, wanted = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": wanted}):
            continue
        name = canonicalize_name(requirement.name)
        if name in needed:
            continue
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        needed.add(name)
        todo += [(Requirement(r), e) for r in requires for e in ("", *requirement.extras)]
    return needed


def expose(distributions: Iterable[str], folder: Path) -> None:
    """Link each installed distribution's top-level files (packages, modules, ``.dist-info``) into
    ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in distributions:
        dist = metadata.distribution(name)
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            source, link = Path(dist.locate_file(top)), folder / top
            if source.exists() and not link.exists():
                link.symlink_to(source)


def lab_requirements(wheel: Path) -> list[str]:
    """The wheel's own ``Requires-Dist`` lines: what ``pip install hvdsketch[lab]`` installs."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_string(archive.read(name).decode()).get_all("Requires-Dist") or []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of this tree (so the build leaves nothing in the shared checkout)."""
    tree = tmp_path_factory.mktemp("tree")
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "hvdsketch", tree / "hvdsketch", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tree / "dist"
    done = run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, tree)
    assert done.returncode == 0, done.stderr
    (built,) = dist.glob("hvdsketch-*.whl")
    return built


@needs.horovod  # the user here has PyTorch and Horovod
def test_the_wheel_installs_the_plugin_and_the_console_script_asks_for_the_lab(wheel, tmp_path):
    venv, visible = tmp_path / "venv", tmp_path / "visible"
    done = run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert done.returncode == 0, done.stderr
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    (site / "user-framework.pth").write_text(f"{visible}\n")
    expose(closure(["torch", "horovod", "numpy"]), visible)  # what a Horovod PyTorch user has

    def pip_install(target: str) -> None:
        done = run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index", target)
        assert done.returncode == 0, done.stdout + done.stderr

    pip_install(str(wheel))
    done = run(python, "-c", "import hvdsketch, hvdsketch.torch, sys; print(hvdsketch.__version__); "
                             "print('tqdm' in sys.modules or 'matplotlib' in sys.modules)")
    assert done.returncode == 0, done.stderr
    version, lab_loaded = done.stdout.split()
    assert version == metadata.version("hvdsketch") and lab_loaded == "False"

    script = venv / "bin" / "hvdsketch"
    done = run(script, "info")
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stdout + done.stderr
    assert 'pip install "hvdsketch[lab]"' in lines[0] and "tqdm" in lines[0], lines[0]

    expose(closure(lab_requirements(wheel), extra="lab"), visible)  # as pip install "hvdsketch[lab]" gives
    pip_install(f"hvdsketch[lab] @ {wheel.as_uri()}")
    done = run(script, "--help")
    assert done.returncode == 0 and "train" in done.stdout, done.stdout + done.stderr
    done = run(script, "info")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"hvdsketch    {version}" in done.stdout and "PyTorch" in done.stdout, done.stdout
