"""One CLI vocabulary: each command's flags are its options class's fields (so they cannot drift), one
spelling per concept across commands, `--results-dir` honoured wherever a RUN is read, and old spellings
still accepted with a one-line note naming the new one."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_fixtures import make_run

from harness.cli import COMMANDS, _parser
from harness.commands.common import CommandArgs

ROOT = Path(__file__).resolve().parents[1]


def _harness(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _options(parser) -> set[str]:
    out = set()
    for action in parser._actions:
        if action.help == "==SUPPRESS==":
            continue
        out.update(s for s in action.option_strings if s.startswith("--"))
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict):  # subcommands
            for sub in choices.values():
                out |= _options(sub)
    return out


def _args_classes(module) -> list[type[CommandArgs]]:
    return [v for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, CommandArgs) and v is not CommandArgs]


def test_every_command_has_an_options_class_whose_fields_are_its_flags():
    import importlib

    for name, module_name, _ in COMMANDS:
        module = importlib.import_module(f"harness.commands.{module_name}")
        classes = _args_classes(module)
        assert classes, f"harness {name} has no options class"
        flags = {f.metadata["cli"]["flag"] for c in classes for f in dataclasses.fields(c)
                 if "cli" in f.metadata and not f.metadata["cli"].get("positional")}
        parser = _parser(name)
        sub = parser._subparsers._group_actions[0].choices[name]
        visible = _options(sub) - {"--help"}
        extra = visible - flags
        if name == "calc":  # its deployment inputs are a generated group of their own
            extra = {f for f in extra if not f.startswith(("--gpu", "--hbm", "--tp", "--dp", "--runtime", "--kv",
                                                           "--max-num", "--hot", "--spec", "--retained",
                                                           "--host", "--indexer", "--no-"))}
        assert extra == set(), f"harness {name}: flags not from its options class: {extra}"


def test_one_spelling_per_concept_across_commands():
    seen = set()
    for name, _, _ in COMMANDS:
        parser = _parser(name)
        seen |= _options(parser._subparsers._group_actions[0].choices[name])
    for old in ("--plots", "--site", "--no-site", "--cache-dir", "--plot", "--figures-dir"):
        assert old not in seen, f"{old} is still a visible flag"
    assert {"--out", "--results-dir", "--envs-dir", "--clients-dir", "--launcher", "--ray-gpus"} <= seen


@pytest.mark.slow
def test_results_dir_is_honoured_and_old_spellings_still_work(tmp_path):
    results = tmp_path / "elsewhere" / "runs"
    make_run(results, "r1")
    make_run(results, "r2")
    work = tmp_path / "cwd"
    work.mkdir()
    report = _harness("report", "r1", "--results-dir", str(results), "--out", str(tmp_path / "figs"), cwd=work)
    assert report.returncode == 0, report.stderr
    assert (results / "r1" / "report.md").is_file() and any((tmp_path / "figs").glob("*.svg"))
    compare = _harness("compare", "r2", "--reference", "r1", "--results-dir", str(results), cwd=work)
    assert compare.returncode == 0 and "No regressions." in compare.stdout, compare.stderr
    plot = _harness("plot", "r1", "r2", "--results-dir", str(results), "--out", str(tmp_path / "both"), cwd=work)
    assert plot.returncode == 0, plot.stderr
    added = _harness("history", "add", "r1", "--results-dir", str(results), "--store", str(tmp_path / "h"),
                     cwd=work)
    assert added.returncode == 0 and "added night r1" in added.stdout, added.stderr
    # without --results-dir the same id is not found, in one line
    missing = _harness("report", "r1", cwd=work)
    assert missing.returncode == 2 and "no such run folder" in missing.stderr and "Traceback" not in missing.stderr
    # an old spelling still works and says which flag replaced it
    old = _harness("report", str(results / "r1"), "--plots", str(tmp_path / "old"), cwd=work)
    assert old.returncode == 0 and "harness report: --plots is deprecated; use --out" in old.stderr
    assert any((tmp_path / "old").glob("*.svg"))
