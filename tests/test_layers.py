"""The index package is layered one way (issue 41): on-disk format and checksums → codec, inverted file,
metadata, lookup tables → store (reading) → writer (lifecycle) → format 1 → search → sharded → distributed. A module
imports only those below it — function-level imports count — so no import circle can form."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "agrame"
LAYERS = ["format", "lock", "base", "codec", "metadata", "ivf", "lut", "batch", "store", "writer", "v1", "search", "sharded",
          "distributed", "__init__"]


def imported_siblings(path: Path, package: str) -> set:
    """Modules of ``package`` that ``path`` imports anywhere in its body (relative or absolute)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.level == 0 and node.module and node.module.startswith(package + "."):
                found.add(node.module[len(package) + 1:].split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(package + "."):
                    found.add(alias.name[len(package) + 1:].split(".")[0])
    return found


def test_every_index_module_has_a_layer():
    assert sorted(p.stem for p in (ROOT / "index").glob("*.py")) == sorted(LAYERS)


def test_no_index_module_imports_one_above_it():
    wrong = []
    for name in LAYERS:
        for dep in imported_siblings(ROOT / "index" / f"{name}.py", "agrame.index"):
            if dep in LAYERS and LAYERS.index(dep) >= LAYERS.index(name):
                wrong.append(f"{name} imports {dep}")
    assert wrong == []


def test_the_check_sees_function_level_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from .search import Index\n    import agrame.index.writer\n")
    assert imported_siblings(module, "agrame.index") == {"search", "writer"}


def test_delta_and_encoder_do_not_import_each_other():
    delta = imported_siblings(ROOT / "delta.py", "agrame")
    encoder = imported_siblings(ROOT / "encoder.py", "agrame")
    assert not ("encoder" in delta and "delta" in encoder), (delta, encoder)
