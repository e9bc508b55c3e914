"""The plugin apart from the lab: what a training script imports loads none of the lab's dependencies,
the plugin never imports the lab, and no module of the package imports itself in a circle."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx
import pytest

from tests import needs

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hvdsketch"
LAB_ONLY = ("yaml", "tqdm", "matplotlib", "mpi4py", "hvdsketch.lab")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports, at module level or inside functions. Importing ``a.b.c``
    also runs ``a.b``'s ``__init__``, which counts unless ``a.b`` is a package ``path`` belongs to (it is
    running already); a name taken from such a package's ``__init__`` counts (the circle a
    function-level import only hides)."""
    me = module_name(path)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if not target.startswith("hvdsketch"):
                continue
            out.add(target)
            parts = target.split(".")
            out.update(ancestor for ancestor in (".".join(parts[:d]) for d in range(2, len(parts)))
                       if not me.startswith(ancestor + "."))
    out.discard(me)
    return out


def graph() -> networkx.DiGraph:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    g = networkx.DiGraph()
    for path in paths:
        g.add_node(module_name(path))
        g.add_edges_from((module_name(path), target) for target in imports(path, modules))
    return g


def test_the_package_has_no_import_cycle():
    cycles = list(networkx.simple_cycles(graph()))
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles[:5])


def test_the_plugin_never_imports_the_lab():
    g = graph()
    plugin = [m for m in g if not m.startswith("hvdsketch.lab")]
    assert not [(m, t) for m in plugin for t in g.successors(m) if t.startswith("hvdsketch.lab")]


@needs.horovod
@pytest.mark.parametrize("framework, adapter", [("torch", "horovod.torch"), ("tensorflow", "horovod.tensorflow")])
def test_importing_the_plugin_loads_none_of_the_lab_dependencies(framework, adapter):
    """Measured against what the framework and Horovod load themselves (torch imports tqdm, say)."""
    code = (f"import sys, {framework}, {adapter}; before = set(sys.modules); import hvdsketch.{framework}; "
            f"print(' '.join(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin", "TF_USE_LEGACY_KERAS": "1",
                               "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert any(m == f"hvdsketch.{framework}" for m in loaded)
    assert [m for m in loaded if m.startswith(LAB_ONLY)] == []

