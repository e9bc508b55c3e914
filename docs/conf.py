"""Sphinx configuration of hvdsketch's documentation; ``python docs/build.py OUT`` builds it.

The site is built in two Sphinx runs (build.py), one per framework, since one process must not
import ``horovod.torch`` and ``horovod.tensorflow`` together. Each run reads every page and imports
for real what its own API pages document; a page of the other run is read as a stub of its title.
The main run resolves references to the TensorFlow API through the TensorFlow run's inventory
(intersphinx). Everything is nitpicky: under ``-W`` a reference that resolves nowhere fails it.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Horovod 0.28.1's TensorFlow needs tf-keras
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import hvdsketch  # noqa: E402


def _build_module():
    """docs/build.py, which names the pages of each run."""
    spec = importlib.util.spec_from_file_location("hvdsketch_docs_build", Path(__file__).with_name("build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FRAMEWORK_PAGES: dict[str, str] = _build_module().FRAMEWORK_PAGES
RUN = "tensorflow" if tags.has("tensorflow") else "main"  # noqa: F821 (Sphinx defines tags)
#: The main run's: where the TensorFlow run's objects.inv lies (build.py sets it).
TENSORFLOW_INVENTORY = os.environ.get("HVDSKETCH_DOCS_TENSORFLOW_INVENTORY")

project = "hvdsketch"
author = "hvdsketch's authors"
copyright = "hvdsketch's authors, Apache-2.0"
release = version = hvdsketch.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.intersphinx"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings say what each argument takes
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_param = False  # "num_groups / groups:" is one entry, not a type and a name

nitpicky = True
#: Names of other projects (no inventory of theirs is reachable offline), shown as code.
nitpick_ignore_regex = [
    ("py:.*", r"(torch|tf|tensorflow|keras|tf_keras|np|numpy|horovod|hvd|dist|typing|collections|abc)(\..*)?"),
    ("py:.*", r"(Any|Callable|Iterable|Mapping|Sequence|Optional|Union|ModuleType|Path|NoneType|ClassVar)"),
    ("py:class", "optional"),  # napoleon's "(Callable, optional)" in docstrings inherited from torch
]

intersphinx_mapping = {}
if RUN == "main" and TENSORFLOW_INVENTORY:
    intersphinx_mapping["tensorflow-api"] = (".", TENSORFLOW_INVENTORY)  # its pages land in this site
intersphinx_disabled_reftypes = ["std:*"]  # the TensorFlow run's Python objects, never its pages or labels

html_theme = "alabaster"
html_title = f"hvdsketch {release}"
html_static_path: list[str] = []
html_copy_source = False


def _stub(app: Sphinx, docname: str, source: list[str]) -> None:
    """A page of the other run: its title only (that run builds it)."""
    if FRAMEWORK_PAGES.get(docname, RUN) != RUN:  # an API page, in reST: its title is its first two lines
        title = "\n".join(source[0].splitlines()[:2])
        source[0] = f"{title}\n\nBuilt by the {FRAMEWORK_PAGES[docname]} run of docs/build.py.\n"


#: The framework the other run imports: never imported here.
OTHER_FRAMEWORK = "torch" if RUN == "tensorflow" else "tensorflow"
_MISSING = object()


def _exists(path: str) -> bool:
    """Whether ``path`` names a module of hvdsketch or something in one (never importing the other
    run's framework)."""
    if not path.startswith("hvdsketch.") or OTHER_FRAMEWORK in path.split("."):
        return False
    parts = path.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name, _MISSING)
            if found is _MISSING:
                return False
        return True
    return False


def _unresolved(app: Sphinx, env, node, contnode):
    """A reference the API pages do not resolve. In the TensorFlow run, one outside its pages is the
    main run's to resolve. One to hvdsketch's internals (the engine, a front end's private modules:
    documented in their source, not in the reference) shows as code where the name exists, and
    fails the build where it does not; the public names are all in the reference (test_docs.py)."""
    if RUN == "tensorflow" and FRAMEWORK_PAGES.get(node.get("refdoc")) != "tensorflow":
        return contnode
    target = node.get("reftarget", "")
    within = [node.get("py:module"), ".".join(filter(None, (node.get("py:module"), node.get("py:class"))))]
    if any(_exists(path) for path in [target] + [f"{scope}.{target}" for scope in within if scope]):
        return contnode
    return None


def setup(app: Sphinx) -> None:
    app.connect("source-read", _stub)
    app.connect("missing-reference", _unresolved)
