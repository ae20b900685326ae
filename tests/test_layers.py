"""The index package is layered one way (issue 41): on-disk format and checksums → codec, inverted file,
metadata, lookup tables → store (reading) → writer (lifecycle) → format 1 → search → sharded → distributed. A module
imports only those below it — function-level imports count — so no import circle can form.

And the whole product (issue 54): no import circle between any two modules of ``agrame`` and ``agrame_app``
(function-level imports count), nothing imported from ``benchmarks`` or ``training``, and the core
(``agrame``) imports neither its front ends (``agrame_app``) nor ``propcite``."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "agrame"
PRODUCT = ("agrame", "agrame_app")
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


def test_the_encoder_is_the_encoder_and_the_model_files_sit_above_it():
    # encoder (the module) → backbones → delta (the file format) → loading (names and folders)
    order = ["encoder", "backbones", "delta", "loading"]
    wrong = [f"{name} imports {dep}" for name in order for dep in imported_siblings(ROOT / f"{name}.py", "agrame")
             if dep in order and order.index(dep) >= order.index(name)]
    assert wrong == []
    assert len((ROOT / "encoder.py").read_text().splitlines()) <= 500


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_imports(packages=PRODUCT) -> dict:
    """``{module: [(imported module, names imported from it or ())…]}`` for the product (or ``packages``),
    anywhere in its body (absolute names)."""
    out = {}
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            name = _module_name(path)
            here = name if path.name == "__init__.py" else name.rpartition(".")[0]
            found = []
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):
                    base = here.split(".")[:len(here.split(".")) - node.level + 1] if node.level else []
                    found.append((".".join(base + ([node.module] if node.module else [])),
                                  tuple(alias.name for alias in node.names)))
                elif isinstance(node, ast.Import):
                    found.extend((alias.name, ()) for alias in node.names)
            out[name] = found
    return out


def import_graph(packages=PRODUCT) -> dict:
    """Edges between the product's own modules (or ``packages``'): ``from P import m`` of a submodule ``m`` is
    an edge to ``P.m`` alone (Python runs ``P/__init__`` first, but that is no circle of the code's making)."""
    imports = product_imports(packages)

    def own(target: str) -> str:
        while target and target not in imports:
            target = target.rpartition(".")[0]
        return target

    graph = {}
    for name, found in imports.items():
        edges = set()
        for module, names in found:
            submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in imports]
            edges.update(submodules)
            if len(submodules) < len(names) or not names:
                edges.add(own(module))
        edges.discard(name)
        edges.discard("")
        graph[name] = edges
    return graph


def cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_anywhere_in_the_product():
    assert cycles(import_graph()) == []


#: Every package of the repository, and which others each may import (issue 62: the safety suite in a package of its
#: own, ``benchmarks`` importing neither the research scripts nor the suite).
REPOSITORY = {"agrame": set(), "propcite": {"agrame"}, "agrame_app": {"agrame", "propcite"},
              "benchmarks": {"agrame", "agrame_app", "propcite"},
              "training": {"agrame", "agrame_app", "propcite", "benchmarks"},
              "reliability": {"agrame", "agrame_app", "benchmarks"}}


def test_no_import_circle_anywhere_in_the_repository():
    assert cycles(import_graph(tuple(REPOSITORY))) == []


def test_the_repositorys_packages_import_one_way():
    wrong = sorted(f"{name} imports {target}" for name, found in product_imports(tuple(REPOSITORY)).items()
                   for target, _ in found
                   if target.split(".")[0] in REPOSITORY and target.split(".")[0] != name.split(".")[0]
                   and target.split(".")[0] not in REPOSITORY[name.split(".")[0]])
    assert wrong == []


def test_the_circle_check_finds_a_circle_through_a_function_level_import():
    graph = import_graph()
    assert "agrame.index.metadata" in graph["agrame.io"]  # io reads metadata's validation
    graph["agrame.index.metadata"] = graph["agrame.index.metadata"] | {"agrame.io"}  # the import issue 54 removed
    assert ["agrame.index.metadata", "agrame.io"] in cycles(graph)


def test_the_product_stands_alone():
    wrong = sorted(f"{name} imports {target}" for name, found in product_imports().items() for target, _ in found
                   if target.split(".")[0] in ("benchmarks", "training")
                   or (name.startswith("agrame.") or name == "agrame") and target.split(".")[0] in ("agrame_app", "propcite"))
    assert wrong == []


def test_the_front_ends_are_made_of_small_functions():
    # issue 54: the app factory wires routers to one service; no function of agrame_app over 80 lines
    long = []
    for path in sorted((REPO / "agrame_app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80 or (node.name == "create_app" and length > 60):
                    long.append(f"{path.relative_to(REPO)}:{node.name} ({length} lines)")
    assert long == []
