"""The package tree is the architecture: each module of ``beat/`` sits in a layer, no
module imports one of a layer above its own, and no modules import each other in a
cycle. Every import counts: at the top of a module, inside a function and under
``TYPE_CHECKING`` alike, for a hidden import is still a dependency.

The layers, from the bottom (``docs/explanation/code-tour.md`` tells what each holds):

0. the kernel (errors, limits, models, records, metrics, config) and ``schedule/``:
   what a schedule is and when it fires, pure;
1. ``claim/``: every decision of a claim, and ``monitors/``: when runs open or resolve an
   incident, pure;
2. the adapters: ``store/`` (PostgreSQL), ``lease/`` (Redis), ``publish/`` (the broker),
   ``notify/`` (the channels incidents are sent to),
   ``sources/`` (the schedulers an import reads);
3. what runs on them: ``leader/`` (the leader's loop) and ``delivery/`` (a worker's side);
4. the composition roots Celery loads: ``beat.scheduler`` and ``beat.worker``;
5. what operators use: ``ops/`` (the Python API beneath the others) and ``ui/``;
6. the ``schedules`` command (``beat.cli``, which also serves the UI) and the package's
   own facade, ``beat``.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Each module's layer, by the longest prefix of its dotted name listed here.
LAYERS: Mapping[str, int] = {
    "beat.errors": 0,
    "beat.limits": 0,
    "beat.models": 0,
    "beat.records": 0,
    "beat.metrics": 0,
    "beat.config": 0,
    "beat.config_values": 0,
    "beat.celery_reports": 0,
    "beat.sockets": 0,
    "beat.process_locks": 0,
    "beat.redis_urls": 0,
    "beat.database_urls": 0,
    "beat.schedule": 0,
    "beat.claim": 1,
    "beat.monitors": 1,
    "beat.store": 2,
    "beat.sources": 2,
    "beat.lease": 2,
    "beat.publish": 2,
    "beat.notify": 2,
    "beat.migrations": 2,
    "beat.leader": 3,
    "beat.delivery": 3,
    "beat.scheduler": 4,
    "beat.worker": 4,
    "beat.ops": 5,
    "beat.ui": 5,
    "beat.cli": 6,
    "beat": 6,
}


def modules_of(package_dir: Path) -> dict[str, Path]:
    """Every module under ``package_dir``, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of ``modules`` that the module ``name`` imports, wherever it does."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_known(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else _known(base, modules))
    found.discard("")
    found.discard(name)
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _known(dotted: str, modules: Mapping[str, Path]) -> str:
    """The longest prefix of ``dotted`` that is one of ``modules``, or ''."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in modules:
            return prefix
    return ""


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    modules = modules_of(package_dir)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def layer_of(module: str, layers: Mapping[str, int]) -> int | None:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in layers:
            return layers[prefix]
    return None


def upward_imports(
    graph: Mapping[str, set[str]], layers: Mapping[str, int]
) -> list[tuple[str, str]]:
    """Each (importer, imported) pair whose imported module sits in a higher layer."""
    return sorted(
        (importer, imported)
        for importer, imported_modules in graph.items()
        for imported in imported_modules
        if (layer_of(imported, layers) or 0) > (layer_of(importer, layers) or 0)
    )


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = lowest[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                lowest[node] = min(lowest[node], lowest[successor])
            elif successor in on_stack:
                lowest[node] = min(lowest[node], index[successor])
        if lowest[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The graph between the sub-packages (``beat.store``, ``beat.lease``, ...); the
    kernel's single modules are left to the graph of modules."""
    packages = {".".join(name.split(".")[:2]) for name in graph if name.count(".") >= 2}

    def package(module: str) -> str | None:
        name = ".".join(module.split(".")[:2])
        return name if name in packages else None

    folded: dict[str, set[str]] = {name: set() for name in packages}
    for importer, imported_modules in graph.items():
        source = package(importer)
        if source is not None:
            targets = (package(imported) for imported in imported_modules)
            folded[source].update(t for t in targets if t is not None and t != source)
    return folded


def _beat_graph() -> dict[str, set[str]]:
    return import_graph(ROOT / "beat")


def test_every_module_of_the_package_sits_in_a_layer() -> None:
    unplaced = [name for name in _beat_graph() if layer_of(name, LAYERS) is None]
    assert unplaced == [], "give these modules a layer in LAYERS"


def test_no_module_imports_a_module_of_a_layer_above_its_own() -> None:
    assert upward_imports(_beat_graph(), LAYERS) == []


def test_no_modules_import_each_other_in_a_cycle() -> None:
    graph = _beat_graph()
    graph.pop("beat")  # the facade imports what it re-exports; nothing imports it
    assert cycles(graph) == []


def test_no_packages_of_one_layer_import_each_other_in_a_cycle() -> None:
    graph = _beat_graph()
    graph.pop("beat")
    assert cycles(package_graph(graph)) == []


def test_nothing_inside_the_package_imports_its_facade() -> None:
    importers = sorted(name for name, imported in _beat_graph().items() if "beat" in imported)
    assert importers == []


# -- the checks themselves, on planted packages ----------------------------------------


def _plant(root: Path, files: Mapping[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "beat"


PLANTED_LAYERS = {"beat": 5, "beat.schedule": 0, "beat.store": 2, "beat.leader": 3}


@pytest.mark.parametrize(
    "importing",
    [
        "from beat.leader import loop\n",
        "import beat.leader.loop\n",
        "def later():\n    from beat.leader.loop import Loop\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from beat.leader import loop\n",
        "from ..leader import loop\n",
    ],
    ids=["from", "import", "in-a-function", "type-checking", "relative"],
)
def test_a_planted_upward_import_is_found_however_it_is_written(
    tmp_path: Path, importing: str
) -> None:
    beat = _plant(
        tmp_path,
        {
            "beat/__init__.py": "",
            "beat/store/__init__.py": "",
            "beat/store/tables.py": importing,
            "beat/leader/__init__.py": "",
            "beat/leader/loop.py": "Loop = object\n",
        },
    )
    assert upward_imports(import_graph(beat), PLANTED_LAYERS) == [
        ("beat.store.tables", "beat.leader.loop")
    ]


def test_a_planted_cycle_is_found_between_modules_and_between_packages(
    tmp_path: Path,
) -> None:
    beat = _plant(
        tmp_path,
        {
            "beat/__init__.py": "",
            "beat/store/__init__.py": "",
            "beat/store/runs.py": "from beat.store import stats\n",
            "beat/store/stats.py": "def later():\n    from beat.store.runs import x\n",
            "beat/store/tables.py": "from beat.leader import armed\n",
            "beat/leader/__init__.py": "",
            "beat/leader/armed.py": "from beat.store import tables\n",
        },
    )
    graph = import_graph(beat)
    graph.pop("beat")
    assert cycles(graph) == [
        ["beat.leader.armed", "beat.store.tables"],
        ["beat.store.runs", "beat.store.stats"],
    ]
    assert cycles(package_graph(graph)) == [["beat.leader", "beat.store"]]


def test_a_tree_without_a_cycle_or_an_upward_import_passes(tmp_path: Path) -> None:
    beat = _plant(
        tmp_path,
        {
            "beat/__init__.py": "from beat.leader import loop\n",
            "beat/schedule/__init__.py": "",
            "beat/schedule/timing.py": "",
            "beat/store/__init__.py": "",
            "beat/store/runs.py": "from beat.schedule import timing\n",
            "beat/leader/__init__.py": "",
            "beat/leader/loop.py": "from beat.store.runs import x\n",
        },
    )
    graph = import_graph(beat)
    assert upward_imports(graph, PLANTED_LAYERS) == []
    graph.pop("beat")
    assert cycles(graph) == []


# -- sizes: a module or class past these holds more than one job ------------------------

#: Longest module of ``beat/`` (its migrations aside), in lines.
MAX_MODULE_LINES = 600
#: Longest class, in lines.
MAX_CLASS_LINES = 300


def too_long(package_dir: Path) -> list[str]:
    """Each module over ``MAX_MODULE_LINES`` and each class over ``MAX_CLASS_LINES``."""
    found = []
    for name, path in modules_of(package_dir).items():
        if ".migrations" in name:
            continue
        text = path.read_text()
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_CLASS_LINES:
                    found.append(f"{name}.{node.name}: {length} lines")
    return found


def test_no_module_and_no_class_of_the_package_is_over_its_length() -> None:
    assert too_long(ROOT / "beat") == [], "split these by concern"


def test_a_planted_long_module_and_a_long_class_are_found(tmp_path: Path) -> None:
    long_class = "class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES
    beat = _plant(
        tmp_path,
        {
            "beat/__init__.py": "",
            "beat/long.py": "x = 1\n" * (MAX_MODULE_LINES + 1),
            "beat/store/__init__.py": "",
            "beat/store/classes.py": long_class,
            "beat/migrations/versions/0001_all.py": "x = 1\n" * (MAX_MODULE_LINES + 1),
        },
    )
    assert too_long(beat) == [
        f"beat.long: {MAX_MODULE_LINES + 1} lines",
        f"beat.store.classes.Big: {MAX_CLASS_LINES + 1} lines",
    ]
