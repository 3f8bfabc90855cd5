"""The map of one training step (``integration/__init__.py``'s docstring, the README's "One training step") names
files that exist: a file moved or renamed must be moved in the map too."""

import re
from pathlib import Path

import openrlhf

import openrlhf_classmate.integration

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "openrlhf_classmate"
UPSTREAM = Path(openrlhf.__file__).resolve().parent.parent  # openrlhf/... names upstream's files
FILE = re.compile(r"`{1,2}((?:[\w.-]+/)*[\w.-]+\.py)`{1,2}")


def _readme_map() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("### One training step")
    return text[start : text.index("\n#", start + 1)]


def test_every_file_of_the_step_map_exists():
    for where, text in (("integration/__init__.py", openrlhf_classmate.integration.__doc__),
                        ("README.md", _readme_map())):
        named = FILE.findall(text)
        assert len(named) > 10, f"{where}: the step map names no files"
        missing = sorted({name for name in named if not any((base / name).is_file() for base in (PACKAGE, ROOT, UPSTREAM))})
        assert not missing, f"{where}: the step map names files that do not exist: {missing}"
