"""The documentation is true to the repository: every path README.md and docs/ name exists, every
`python -m harness` command they show is one the CLI has, and every page links only to pages that exist."""

from __future__ import annotations

import re
from pathlib import Path

from harness.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("harness/", "launch/", "sweeps/", "datasets/", "docs/", "kernels/", "benchmarks/", "tests/", "tools/",
       ".github/", ".ci/")
# written by a run or a build, not shipped: named in the docs, absent from a checkout
PRODUCED = ("results/", "plots/", "site/", "datasets/built", "history/", "kernels/hisparse/build")
_TOPS = "|".join(re.escape(t) for t in TOP)
_PATH = re.compile(r"(?<![\w./<>-])((?:" + _TOPS + r")[\w./*<>{}-]*[\w*>}])")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _named_paths(page: Path) -> list[tuple[int, str]]:
    out = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for found in _PATH.findall(line):
            out.append((number, found))
        for link in _LINK.findall(line):
            if not link.startswith(("http://", "https://", "mailto:")):
                out.append((number, str((page.parent / link).resolve().relative_to(ROOT)) if
                            (page.parent / link).resolve().is_relative_to(ROOT) else link))
    return out


def _exists(path: str) -> bool:
    if any(ch in path for ch in "<>*{}$") or path.startswith(PRODUCED):
        return True
    return (ROOT / path).exists()


def test_every_path_the_docs_name_exists():
    missing = [f"{page.relative_to(ROOT)}:{number}: {path}" for page in PAGES for number, path in _named_paths(page)
               if not _exists(path)]
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_every_harness_command_the_docs_show_exists():
    names = {name for name, _, _ in COMMANDS}
    shown = [(page.relative_to(ROOT), m) for page in PAGES
             for m in re.findall(r"python -m harness ([a-z][\w-]*)", page.read_text(encoding="utf-8"))]
    unknown = [f"{page}: harness {cmd}" for page, cmd in shown if cmd not in names]
    assert shown and not unknown, unknown


def test_the_checker_finds_a_path_that_is_not_there(tmp_path):
    page = tmp_path / "x.md"
    page.write_text("see `harness/nothing_here.py` and [a page](docs/none.md)\n")
    paths = [p for _, p in _named_paths(page)]
    assert "harness/nothing_here.py" in paths and not _exists("harness/nothing_here.py")
