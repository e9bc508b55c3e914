"""The documentation site (docs/): ``python docs/build.py OUT`` builds it with Sphinx, warnings as
errors (a broken link, a reference that resolves nowhere, an API page that fails to import), and its
API reference holds every public name of the front ends."""
from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import needs
from tests.spawn import clean_env

#: The site documents the Horovod front ends, so it builds where Horovod, TensorFlow and Sphinx are.
pytestmark = [needs.horovod, needs.tensorflow, pytest.mark.skipif(importlib.util.find_spec("sphinx") is None,
                                                                reason="needs Sphinx (the docs extra)")]

ROOT = Path(__file__).resolve().parents[2]
#: The modules whose every public name the API reference must hold.
DOCUMENTED = ["hvdsketch.torch", "hvdsketch.torch.ddp", "hvdsketch.torch.fsdp", "hvdsketch.tensorflow"]


def _build_module():
    spec = importlib.util.spec_from_file_location("hvdsketch_docs_build", ROOT / "docs" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _build_module()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "build.py"), str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=clean_env())
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert done.returncode == 0, "\n".join(warnings) or done.stderr[-3000:]
    return out


def source_of(module: str) -> Path | None:
    """The file of an hvdsketch module (a package's __init__.py), or None."""
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py") if path.with_suffix(".py").exists() else None


def public_names(module: str) -> list[str]:
    """The public names of ``module``, read from its source without importing it (one process must
    not import both frameworks): its ``__all__``, else its top-level classes and functions without a
    leading underscore; a public submodule counts as its own name and all of its public names."""
    tree = ast.parse(source_of(module).read_text())
    listed = next((ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)), None)
    if listed is None:
        listed = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                  and not node.name.startswith("_")]
    names = []
    for name in listed:
        names.append(f"{module}.{name}")
        if source_of(f"{module}.{name}") is not None:
            names.extend(public_names(f"{module}.{name}"))
    return names


def documented(site: Path) -> set[str]:
    """Every Python object the site's inventory describes."""
    _, entries = build.read_inventory(site / "objects.inv")
    return {entry.decode().split(" ")[0] for entry in entries if entry.decode().split(" ")[1].startswith("py:")}


def missing(names: list[str], described: set[str]) -> list[str]:
    return [name for name in names if name not in described]


def test_the_site_builds_with_warnings_as_errors_and_holds_each_page(site):
    for page in ("index", "getting-started", "compression", "auto", "memory", "checkpoints", "elastic", "errors",
                 "cluster", "api/torch", "api/ddp", "api/tensorflow"):
        assert (site / f"{page}.html").is_file(), page
    # the TensorFlow run's page replaced the main run's stub
    assert 'id="hvdsketch.tensorflow.DistributedGradientTape"' in (site / "api" / "tensorflow.html").read_text()
    # a reference from the main run's pages to the TensorFlow API is a link into that page
    assert 'href="api/tensorflow.html#hvdsketch.tensorflow.DistributedGradientTape"' in \
        (site / "getting-started.html").read_text()


@pytest.mark.parametrize("module", DOCUMENTED)
def test_every_public_name_of_the_front_ends_is_in_the_api_reference(site, module):
    names = public_names(module)
    assert names  # the source was read
    assert missing(names, documented(site)) == []


def test_a_public_name_left_out_of_the_api_reference_is_found(site):
    described = documented(site)
    names = public_names("hvdsketch.tensorflow")
    assert "hvdsketch.tensorflow.keras.GatherStateCallback" in names  # a submodule's own public names count
    assert missing(names, described - {"hvdsketch.tensorflow.keras.GatherStateCallback"}) == [
        "hvdsketch.tensorflow.keras.GatherStateCallback"]


def test_an_unresolved_reference_fails_the_build(site, tmp_path):
    """Warnings are errors: a page naming an API object that does not exist fails the main run (the
    TensorFlow API resolved through the built site's inventory, as build.py resolves it)."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("_build"))
    page = docs / "getting-started.md"
    page.write_text(page.read_text() + "\nSee {func}`hvdsketch.torch.NoSuchFunction`.\n")
    spec = importlib.util.spec_from_file_location("copied_docs_build", docs / "build.py")
    copied = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copied)
    done = subprocess.run(copied.sphinx_command(tmp_path / "out", tmp_path / "doctrees"), cwd=ROOT, capture_output=True,
                          text=True, timeout=600,
                          env=clean_env(HVDSKETCH_DOCS_TENSORFLOW_INVENTORY=str(site / "objects.inv")))
    assert done.returncode != 0
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "hvdsketch.torch.NoSuchFunction" in warnings[0], warnings
