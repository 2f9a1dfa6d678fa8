"""`harness lock [RECIPE ...]`: re-resolve the locks of the environments the harness builds (and the
constraints of its own test install) from their top-level pins; `--check` only says what would change."""

from __future__ import annotations

import argparse
import datetime
from dataclasses import dataclass

from harness.builds.locks import (
    CI_CONSTRAINTS,
    RECIPES,
    REPO_ROOT,
    LockError,
    find_lock,
    lock_path,
    resolve,
    write_constraints,
    write_lock,
)
from harness.commands.common import CommandArgs, option, positional, progress


@dataclass(frozen=True)
class LockArgs(CommandArgs):
    recipes: list[str] = positional(f"which to re-resolve (default: all): {', '.join([*RECIPES, CI_CONSTRAINTS])}",
                                    metavar="RECIPE", nargs="*")
    check: bool = option("--check", "resolve and report what changed, write nothing; exit 1 when a lock would "
                         "change", action="store_true", default=False)


def register(parser: argparse.ArgumentParser) -> None:
    LockArgs.register(parser, run)


def _changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    out = [f"{name} {old.get(name, '-')} -> {new.get(name, '-')}" for name in sorted(set(old) | set(new))
           if old.get(name) != new.get(name)]
    return out


def run(args: LockArgs) -> int:
    wanted = args.recipes or [*RECIPES, CI_CONSTRAINTS]
    unknown = [n for n in wanted if n not in RECIPES and n != CI_CONSTRAINTS]
    if unknown:
        raise LockError(f"unknown recipe {', '.join(unknown)}; known: {', '.join([*RECIPES, CI_CONSTRAINTS])}")
    today = datetime.date.today().isoformat()
    changed = 0
    for name in wanted:
        progress(f"{name}: resolving")
        if name == CI_CONSTRAINTS:
            pins = [p for p in resolve(["-e", ".[test]"], cwd=REPO_ROOT)]
            path = lock_path(name)
            old = {}
            if path.is_file():
                old = dict(line.split("==", 1) for line in path.read_text(encoding="utf-8").splitlines()
                           if "==" in line and not line.startswith("#"))
            new = {p.name: p.version for p in pins}
            moved = _changes(old, new)
            if not args.check and moved:
                write_constraints(pins, path, today=today)
        else:
            recipe = RECIPES[name]
            pins = resolve(list(recipe.requirements))
            existing = find_lock(name)
            old = {p.name: p.version for p in existing.pins} if existing else {}
            excluded = {e.lower() for e in recipe.exclude}
            new = {p.name: p.version for p in pins if p.key not in excluded}
            moved = _changes(old, new)
            path = lock_path(name)
            if not args.check and (moved or existing is None):
                write_lock(recipe, pins, path, today=today)
        changed += bool(moved)
        what = f"{len(moved)} change(s): " + "; ".join(moved[:12]) + (" ..." if len(moved) > 12 else "") \
            if moved else "unchanged"
        print(f"{name}: {len(new)} packages, {what} ({path.name})")
    if args.check:
        return 1 if changed else 0
    return 0
