"""The code tour's module map stays true to the tree: every module of ``beat/`` is in it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_map() -> str:
    tour = (ROOT / "docs" / "explanation" / "code-tour.md").read_text()
    section = tour[tour.index("## The module map") :]
    start = section.index("```\n") + 4
    return section[start : section.index("```", start)]


def _beat_section(module_map: str) -> str:
    return module_map[module_map.index("beat/") : module_map.index("\ntasks/")]


def test_every_module_of_the_package_is_in_the_code_tours_module_map() -> None:
    listed = set(re.findall(r"[a-z_]+", _beat_section(_module_map())))
    modules = {path.stem for path in (ROOT / "beat").glob("*.py") if path.stem != "__init__"}
    assert modules - listed == set(), (
        "add these modules to the module map in docs/explanation/code-tour.md"
    )
