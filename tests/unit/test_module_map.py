"""The README's module map stays true to the tree: every module of ``beat/`` is in it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_map() -> str:
    readme = (ROOT / "README.md").read_text()
    development = readme[readme.index("## Development") :]
    start = development.index("```\n") + 4
    return development[start : development.index("```", start)]


def _beat_section(module_map: str) -> str:
    return module_map[module_map.index("beat/") : module_map.index("\ntasks/")]


def test_every_module_of_the_package_is_in_the_readmes_module_map() -> None:
    listed = set(re.findall(r"[a-z_]+", _beat_section(_module_map())))
    modules = {path.stem for path in (ROOT / "beat").glob("*.py") if path.stem != "__init__"}
    assert modules - listed == set(), "add these modules to the README's module map"
