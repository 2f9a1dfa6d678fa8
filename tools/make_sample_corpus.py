"""Write the shipped offline sample corpus: synthetic OpenHands-style agent trajectories.

The rows follow the schema of nebius/SWE-rebench-openhands-trajectories (train split):
trajectory_id, instance_id, repo, trajectory (messages: role, content, tool_calls, name,
tool_call_id; every key present on every message, null where unused, as in the parquet
rows), tools, model_patch, exit_status, resolved, gen_tests_correct, pred_passes_gen_tests.

Every byte is generated from a fixed seed, so rerunning the script reproduces the files
exactly. The text is invented (issue reports, bash calls, file views, pytest output,
diffs); it only has to look like agent traffic to a tokenizer and to the builder.

    python tools/make_sample_corpus.py            # writes harness/data/samples/
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLES_DIR = REPO_ROOT / "datasets" / "samples"
CORPUS_NAME = "openhands-sample.jsonl"
PAD_NAME = "pad-reasoning.txt"
SEED = 20260101
TRAJECTORIES = 80

OWNERS = ["acme-labs", "pyforge", "datawell", "orbitsoft", "lumen-io", "kestrel", "tidepool", "northwind",
          "quillstack", "mosaicdata", "fernhill", "brightline"]
PROJECTS = ["tabular", "gridkit", "fluxcache", "parsely", "stormlog", "vectorize", "quantiq", "httpkit",
            "configo", "timeseries-lite", "geomesh", "textwrapx", "schemer", "batchpipe", "unitsafe"]
NOUNS = ["buffer", "record", "frame", "schema", "column", "index", "cache", "token", "session", "request",
         "payload", "segment", "window", "chunk", "node", "edge", "config", "parser", "reader", "writer",
         "encoder", "decoder", "metric", "sample", "batch", "queue", "worker", "timer", "offset", "cursor"]
VERBS = ["load", "parse", "merge", "split", "flush", "resolve", "compute", "validate", "normalize", "render",
         "collect", "dispatch", "encode", "decode", "refresh", "prune", "align", "convert", "emit", "scan"]
ADJECTIVES = ["stale", "empty", "nested", "partial", "sorted", "cached", "lazy", "strict", "unicode",
              "negative", "duplicate", "missing", "shared", "frozen", "ragged", "sparse", "large", "naive"]
EXCEPTIONS = ["KeyError", "ValueError", "TypeError", "IndexError", "AttributeError", "RuntimeError",
              "AssertionError", "UnicodeDecodeError", "ZeroDivisionError", "OverflowError"]
TOOLS = [
    {"type": "function", "function": {
        "name": "execute_bash",
        "description": "Run a bash command in a persistent shell session and return its output.",
        "parameters": {"type": "object", "required": ["command"], "properties": {
            "command": {"type": "string", "description": "The command to run."},
            "is_input": {"type": "string", "enum": ["true", "false"],
                         "description": "Whether the command is input to a running process."},
            "timeout": {"type": "number", "description": "Seconds to wait before returning."}}}}},
    {"type": "function", "function": {
        "name": "str_replace_editor",
        "description": "View, create and edit files: view, create, str_replace, insert, undo_edit.",
        "parameters": {"type": "object", "required": ["command", "path"], "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
            "path": {"type": "string", "description": "Absolute path to a file or folder."},
            "old_str": {"type": "string"}, "new_str": {"type": "string"},
            "view_range": {"type": "array", "items": {"type": "integer"}}}}}},
    {"type": "function", "function": {
        "name": "think",
        "description": "Write down a thought; nothing is executed.",
        "parameters": {"type": "object", "required": ["thought"],
                       "properties": {"thought": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "finish",
        "description": "Signal that the task is complete.",
        "parameters": {"type": "object", "required": ["message"],
                       "properties": {"message": {"type": "string"}}}}},
]
# Written for this corpus: a short agent brief in the spirit of an agent scaffold's system prompt.
SYSTEM_PROMPT = """You are a software engineering agent working inside a sandboxed Linux machine.
You can run shell commands, read and edit files, and reason step by step before acting.

<ROLE>
Your job is to resolve the issue the user describes with the smallest correct change.
Reproduce the problem first, then fix it, then show that the fix works.
</ROLE>

<WORKFLOW>
1. Explore the repository to find the code related to the issue.
2. Write a small script that reproduces the problem and run it.
3. Edit the source code to fix the problem; keep unrelated code untouched.
4. Run the reproduction script and the relevant tests again.
5. Think about edge cases and make sure the fix covers them.
</WORKFLOW>

<RULES>
* Use absolute paths with the file editor.
* Do not modify the tests unless the issue asks for it.
* Prefer reading a file in ranges when it is long.
* When you are done, call finish with a short summary.
</RULES>"""


_JARGON_SYLLABLES = ("ba ce di fo gu ha je ki lo mu na pe qui ro su ta ve wi xo yu za bra cle dro fli gru "
                     "plo ste tri an el ix om ur sh th ph").split()


class Writer:
    """Deterministic text pieces drawn from one random stream."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        # each repository has its own jargon, as real ones do (and it gives the BPE more to learn)
        self.jargon = ["".join(rng.choice(_JARGON_SYLLABLES) for _ in range(rng.randint(2, 4)))
                       for _ in range(12)]

    def pick(self, seq):
        if seq is NOUNS and self.rng.random() < 0.35:
            return self.rng.choice(self.jargon)
        return self.rng.choice(seq)

    def ident(self) -> str:
        return f"{self.pick(VERBS)}_{self.pick(NOUNS)}"

    def class_name(self) -> str:
        return self.pick(ADJECTIVES).capitalize() + self.pick(NOUNS).capitalize()

    def sentence(self) -> str:
        r = self.rng
        forms = [
            lambda: f"When the {self.pick(NOUNS)} is {self.pick(ADJECTIVES)}, `{self.ident()}()` returns the wrong "
                    f"{self.pick(NOUNS)}.",
            lambda: f"I expected `{self.ident()}` to keep the {self.pick(ADJECTIVES)} {self.pick(NOUNS)} but it "
                    f"drops it after {r.randint(2, 900)} items.",
            lambda: f"This started after upgrading from {r.randint(0, 3)}.{r.randint(0, 19)}.{r.randint(0, 9)}; "
                    f"the {self.pick(NOUNS)} path now raises {self.pick(EXCEPTIONS)}.",
            lambda: f"The docs say the {self.pick(NOUNS)} should be {self.pick(ADJECTIVES)}, yet "
                    f"`{self.class_name()}.{self.ident()}` treats it as {self.pick(ADJECTIVES)}.",
            lambda: f"On Windows the behaviour differs: paths like `C:\\data\\{self.pick(NOUNS)}_{r.randint(1, 99)}"
                    f".csv` are read twice.",
            lambda: f"Ideally the {self.pick(NOUNS)} would be validated before `{self.ident()}` runs, "
                    f"so the error names the {self.pick(NOUNS)}.",
            lambda: f"Non-ASCII input such as “{self.pick(['naïve', 'café', 'Zürich', 'São Paulo', 'Ωmega'])}” "
                    f"or {self.pick(['→', '—', '…', 'µs', '±', '°C', '≥'])} breaks the {self.pick(NOUNS)} width.",
        ]
        return r.choice(forms)()

    def paragraph(self, n_min: int = 2, n_max: int = 5) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(n_min, n_max)))

    def python_function(self, indent: str = "") -> list[str]:
        r = self.rng
        name, arg, other = self.ident(), self.pick(NOUNS), self.pick(NOUNS)
        lines = [f"{indent}def {name}({arg}, {other}=None, *, strict={r.choice(['True', 'False'])}):",
                 f'{indent}    """{self.pick(VERBS).capitalize()} the {self.pick(ADJECTIVES)} {arg} into a '
                 f'{other}."""']
        for _ in range(r.randint(1, 3)):
            kind = r.randint(0, 5)
            if kind == 0:
                lines.append(f"{indent}    if {arg} is None or not {arg}:")
                lines.append(f"{indent}        raise {self.pick(EXCEPTIONS)}(f\"{self.pick(ADJECTIVES)} {arg}: "
                             f"{{{arg}!r}}\")")
            elif kind == 1:
                lines.append(f"{indent}    {other} = {other} or {{}}")
            elif kind == 2:
                lines.append(f"{indent}    for i, item in enumerate({arg}):")
                lines.append(f"{indent}        {other}[item] = {self.ident()}(item, offset=i + {r.randint(1, 64)})")
            elif kind == 3:
                lines.append(f"{indent}    total = sum(len(x) for x in {arg}) / max(1, len({other}))")
            elif kind == 4:
                lines.append(f"{indent}    # {self.sentence()}")
            else:
                lines.append(f"{indent}    {self.pick(NOUNS)}_{r.randint(0, 9)} = "
                             f"{self.class_name()}({arg}, limit={r.randint(8, 4096)})")
        lines.append(f"{indent}    return {other}")
        return lines

    def python_file(self, n_funcs: int) -> list[str]:
        lines = [f'"""{self.pick(NOUNS).capitalize()} helpers for the {self.pick(PROJECTS)} package."""', "",
                 "from __future__ import annotations", "", "import os", "import re",
                 f"from typing import {self.rng.choice(['Any', 'Iterable', 'Mapping', 'Sequence'])}", ""]
        cls = self.class_name()
        lines.append(f"class {cls}:")
        lines.append("    __slots__ = ()")
        lines.append("")
        for _ in range(n_funcs // 2):
            lines.extend(self.python_function(indent="    "))
            lines.append("")
        for _ in range(n_funcs):
            lines.extend(self.python_function())
            lines.append("")
        return lines

    def file_path(self, repo_dir: str) -> str:
        return f"/workspace/{repo_dir}/{self.pick(PROJECTS).replace('-', '_')}/{self.pick(NOUNS)}s.py"


def _tool_call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _message(role: str, content: str, tool_calls=None, name=None, tool_call_id=None) -> dict:
    return {"role": role, "content": content, "tool_calls": tool_calls, "name": name,
            "tool_call_id": tool_call_id}


def _numbered(lines: list[str], start: int = 1) -> str:
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines, start))


def _pytest_output(w: Writer, test_file: str, passed: bool) -> str:
    r = w.rng
    n = r.randint(4, 25)
    out = ["============================= test session starts ==============================",
           "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
           "rootdir: /workspace", f"collected {n} items", "",
           f"{test_file} " + "".join(r.choice("..........F" if not passed else ".") for _ in range(n)) + " [100%]"]
    if not passed:
        out += ["", "=================================== FAILURES ===================================",
                f"__________________________ test_{w.ident()} __________________________", ""]
        out += [f"    {line}" for line in w.python_function()[:3]]
        out += [f">       assert {w.ident()}({w.pick(NOUNS)}) == {r.randint(0, 500)}",
                f"E       {w.pick(EXCEPTIONS)}: {w.sentence()}", "",
                f"{test_file}:{r.randint(10, 400)}: {w.pick(EXCEPTIONS)}",
                "=========================== short test summary info ============================",
                f"FAILED {test_file}::test_{w.ident()} - {w.pick(EXCEPTIONS)}",
                f"========================= 1 failed, {n - 1} passed in {r.uniform(0.2, 9):.2f}s ========================="]
    else:
        out += [f"============================== {n} passed in {r.uniform(0.2, 9):.2f}s =============================="]
    return "\n".join(out)


def _diff(w: Writer, path: str) -> str:
    rel = path.split("/workspace/", 1)[1].split("/", 1)[1]
    r = w.rng
    start = r.randint(5, 300)
    old = w.python_function()[1:5]
    new = list(old)
    new[-1] = new[-1] + f"  # {w.pick(ADJECTIVES)} {w.pick(NOUNS)} handled"
    lines = [f"diff --git a/{rel} b/{rel}", f"index {r.getrandbits(28):07x}..{r.getrandbits(28):07x} 100644",
             f"--- a/{rel}", f"+++ b/{rel}", f"@@ -{start},{len(old) + 2} +{start},{len(new) + 3} @@"]
    lines += [" " + old[0]] + ["-" + x for x in old[1:]] + ["+" + x for x in new[1:]]
    lines += [f"+    {w.pick(NOUNS)} = {w.ident()}({w.pick(NOUNS)})", " " + old[-1]]
    return "\n".join(lines) + "\n"


def make_trajectory(index: int, rng: random.Random) -> dict:
    w = Writer(rng)
    owner, project = w.pick(OWNERS), w.pick(PROJECTS)
    number = rng.randint(12, 4800)
    repo = f"{owner}/{project}"
    repo_dir = f"{owner}__{project}__{rng.randint(0, 9)}.{rng.randint(0, 20)}"
    instance_id = f"{owner}__{project}-{number}"
    exc = w.pick(EXCEPTIONS)
    title = f"{w.ident()} raises {exc} for {w.pick(ADJECTIVES)} {w.pick(NOUNS)}s"
    issue = "\n\n".join([
        f"### {title}", w.paragraph(3, 7), "**To reproduce**",
        "```python\n" + "\n".join([f"from {project.replace('-', '_')} import {w.class_name()}",
                                   f"x = {w.class_name()}([{', '.join(str(rng.randint(-9, 99)) for _ in range(5))}])",
                                   f"print(x.{w.ident()}())"]) + "\n```",
        "**Traceback**",
        "```\nTraceback (most recent call last):\n" + "\n".join(
            f'  File "/usr/lib/python3.11/site-packages/{project}/{w.pick(NOUNS)}.py", line {rng.randint(5, 900)},'
            f" in {w.ident()}\n    {w.ident()}({w.pick(NOUNS)})" for _ in range(rng.randint(2, 6)))
        + f"\n{exc}: {w.sentence()}\n```",
        "**Expected behaviour**", w.paragraph(1, 4),
        f"Environment: Python 3.{rng.randint(9, 13)}, {project} {rng.randint(0, 3)}.{rng.randint(0, 30)}, "
        f"{w.pick(['Ubuntu 22.04', 'macOS 14', 'Windows 11', 'Debian 12', 'Fedora 40'])}."])
    user = (f"<uploaded_files>\n/workspace/{repo_dir}\n</uploaded_files>\n\n"
            f"I've uploaded a python code repository in the directory {repo_dir}. Consider the following issue "
            f"description:\n\n<issue_description>\n{issue}\n</issue_description>\n\n"
            "Can you help me implement the necessary changes to the repository so that the requirements "
            "specified in the <issue_description> are met? Keep changes minimal and do not modify tests.")
    messages = [_message("system", SYSTEM_PROMPT), _message("user", user)]
    calls = 0
    edited: list[str] = []
    for _step in range(rng.randint(13, 15)):
        calls += 1
        call_id = f"toolu_{index:03d}_{calls:02d}"
        thought = w.paragraph(1, 1) if rng.random() < 0.7 else ""
        kind = rng.choice(["view", "view", "grep", "bash", "pytest", "edit", "think", "ls"])
        path = w.file_path(repo_dir)
        if kind == "view":
            args = {"command": "view", "path": path}
            body = w.python_file(rng.randint(1, 2))
            out = f"Here's the result of running `cat -n` on {path}:\n{_numbered(body)}"
            name = "str_replace_editor"
        elif kind == "ls":
            args = {"command": f"find /workspace/{repo_dir} -name '*.py' | head -{rng.randint(20, 60)}"}
            out = "\n".join(w.file_path(repo_dir) for _ in range(rng.randint(5, 15)))
            name = "execute_bash"
        elif kind == "grep":
            pattern = w.ident()
            args = {"command": f"grep -rn '{pattern}' /workspace/{repo_dir} --include=*.py"}
            out = "\n".join(f"{w.file_path(repo_dir)}:{rng.randint(1, 900)}:    {w.sentence()}"
                            for _ in range(rng.randint(2, 6)))
            name = "execute_bash"
        elif kind == "bash":
            script = f"/workspace/reproduce_{w.pick(NOUNS)}.py"
            args = {"command": f"cd /workspace/{repo_dir} && python {script}"}
            out = "\n".join(f"{w.pick(NOUNS)}[{i}] = {rng.uniform(-1e4, 1e4):.6f} ({w.pick(ADJECTIVES)})"
                            for i in range(rng.randint(3, 9)))
            if rng.random() < 0.5:
                out += f"\nTraceback (most recent call last):\n  File \"{script}\", line {rng.randint(3, 40)}\n" \
                       f"{w.pick(EXCEPTIONS)}: {w.sentence()}"
            out += f"\n[The command completed with exit code {rng.choice([0, 0, 1])}.]"
            name = "execute_bash"
        elif kind == "pytest":
            test_file = f"tests/test_{w.pick(NOUNS)}s.py"
            args = {"command": f"cd /workspace/{repo_dir} && python -m pytest {test_file} -x -q"}
            out = _pytest_output(w, test_file, passed=rng.random() < 0.4)
            name = "execute_bash"
        elif kind == "edit":
            old = "\n".join(w.python_function()[1:3])
            new = old + f"\n    # guard the {w.pick(ADJECTIVES)} {w.pick(NOUNS)} case"
            args = {"command": "str_replace", "path": path, "old_str": old, "new_str": new}
            snippet = _numbered(w.python_function()[:4], start=rng.randint(10, 300))
            out = (f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of "
                   f"{path}:\n{snippet}\nReview the changes and make sure they are as expected.")
            edited.append(path)
            name = "str_replace_editor"
        else:
            args = {"thought": w.paragraph(2, 6)}
            out = "Your thought has been logged."
            name = "think"
        messages.append(_message("assistant", thought, tool_calls=[_tool_call(call_id, name, args)]))
        messages.append(_message("tool", out, name=name, tool_call_id=call_id))
    calls += 1
    summary = f"I fixed the issue: {w.paragraph(1, 3)}"
    messages.append(_message("assistant", summary, tool_calls=[
        _tool_call(f"toolu_{index:03d}_{calls:02d}", "finish", {"message": summary})]))
    patch = "".join(_diff(w, p) for p in (edited or [w.file_path(repo_dir)]))
    resolved = int(rng.random() < 0.55)
    gen = rng.choice([None, 0.0, 1.0])
    return {
        "trajectory_id": f"sample-{index:04d}-{rng.getrandbits(64):016x}",
        "instance_id": instance_id,
        "repo": repo,
        "trajectory": messages,
        "tools": TOOLS,
        "model_patch": patch,
        "exit_status": "submit",
        "resolved": resolved,
        "gen_tests_correct": gen,
        "pred_passes_gen_tests": None if gen is None else float(rng.random() < 0.5),
    }


def make_pad_text(rng: random.Random, paragraphs: int) -> str:
    """Science-flavoured reasoning prose, with the <think> markup the pad cleaner strips."""
    w = Writer(rng)
    subjects = ["the reaction rate", "the equilibrium constant", "the wave function", "the free energy",
                "the orbital period", "the enzyme activity", "the thermal conductivity", "the decay constant",
                "the refractive index", "the population growth", "the binding affinity", "the entropy change"]
    out = []
    for i in range(paragraphs):
        a, b = rng.uniform(0.1, 99), rng.uniform(0.1, 99)
        steps = [
            f"We need {rng.choice(subjects)} when the temperature rises from {a:.1f} K to {a + b:.1f} K.",
            f"Using the relation k = A·exp(−Ea/RT) with Ea = {rng.randint(10, 200)} kJ/mol, the ratio is "
            f"exp({rng.uniform(-5, 5):.3f}) ≈ {rng.uniform(0.01, 50):.3f}.",
            f"Check the units: {rng.choice(['J/(mol·K)', 'm/s²', 'mol/L', 'kg·m²', 'eV', 'Pa·s'])} cancel, "
            f"so the answer is dimensionless.",
            f"Option {rng.choice('ABCD')} says {rng.choice(subjects)} doubles, which contradicts step {rng.randint(1, 4)}.",
            f"Therefore the correct choice is {rng.choice('ABCD')}, about {rng.uniform(1, 1e3):.2f} in these units.",
            w.sentence(),
        ]
        rng.shuffle(steps)
        body = " ".join(steps)
        out.append(f"<think>\n{body}\n</think>\n\n" if i % 3 == 0 else body + "\n\n")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=SAMPLES_DIR)
    parser.add_argument("--trajectories", type=int, default=TRAJECTORIES)
    args = parser.parse_args(argv)
    rng = random.Random(SEED)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = [make_trajectory(i, rng) for i in range(args.trajectories)]
    corpus = "".join(json.dumps(row, ensure_ascii=False, sort_keys=False) + "\n" for row in rows)
    (args.out_dir / CORPUS_NAME).write_text(corpus, encoding="utf-8")
    pad = make_pad_text(random.Random(SEED + 1), paragraphs=110)
    (args.out_dir / PAD_NAME).write_text(pad, encoding="utf-8")
    print(f"wrote {args.out_dir / CORPUS_NAME} ({len(rows)} trajectories, {len(corpus.encode()):,} bytes)")
    print(f"wrote {args.out_dir / PAD_NAME} ({len(pad.encode()):,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
