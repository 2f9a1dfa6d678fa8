"""The import graph of harness/, read from the code's own imports: no circles, no import from a lower
layer to a higher one, and no import of the harness's own modules hidden inside a function except
where a heavy third-party library is the reason (listed below with it)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "harness"

# Bottom to top. A module may import its own layer or any layer below (docs/architecture.md).
LAYERS: list[tuple[str, ...]] = [
    ("harness", "harness.forkserver", "harness.errors", "harness.io", "harness.redact", "harness.catalogue", "harness.vllm_names"),
    ("harness.schema", "harness.support"),
    ("harness.config", "harness.records"),
    ("harness.calc", "harness.metrics", "harness.dataset", "harness.sim", "harness.hub", "harness.hub_rows",
     "harness.provenance", "harness.evidence", "harness.telemetry"),
    ("harness.results", "harness.summary", "harness.judge", "harness.builds", "harness.servers", "harness.loadgen",
     "harness.correctness", "harness.fetch", "harness.weights"),
    ("harness.plan",),
    ("harness.point", "harness.runner", "harness.simulate", "harness.calibrate", "harness.capacity"),
    ("harness.report", "harness.nightly", "harness.session"),
    ("harness.commands", "harness.cli", "harness.__main__"),
]

# (importer, imported): why the import waits until the function runs.
LAZY_ALLOWED = {
    ("harness.runner", "harness.servers.ray_launcher"): "imports ray (seconds); only the chosen launcher loads",
    ("harness.runner", "harness.servers.local"): "pairs with the Ray launcher's lazy import",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    return [n for n in names if n in MODULES and n != module]


def _imports() -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
    """Module-level edges (TYPE_CHECKING blocks included: they are edges too), and function-level ones."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    lazy: list[tuple[str, str, int]] = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_function: set[int] = set()
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                in_function.update(id(n) for n in ast.walk(fn))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(module, node):
                    edges[module].add(target)
                    if id(node) in in_function:
                        lazy.append((module, target, node.lineno))
    return edges, lazy


def _layer(module: str) -> int:
    best, best_len = None, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_import_goes_up_a_layer():
    edges, _ = _imports()
    upward = [f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
              for a, targets in edges.items() for b in targets if _layer(b) > _layer(a)]
    assert not upward, "\n".join(upward)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_circles():
    edges, _ = _imports()
    assert not _cycles(edges), f"import circles: {_cycles(edges)}"


def test_lazy_imports_of_own_modules_only_for_heavy_libraries():
    _, lazy = _imports()
    hidden = [f"{a}:{line} imports {b} inside a function" for a, b, line in lazy if (a, b) not in LAZY_ALLOWED]
    assert not hidden, "\n".join(hidden)


def test_the_checker_sees_a_circle_and_an_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: a planted circle and upward import are found."""
    fake = {"harness.config.x": tmp_path / "x.py", "harness.plan": tmp_path / "plan.py"}
    fake["harness.config.x"].write_text("from harness.plan import y\n")
    fake["harness.plan"].write_text("from harness.config.x import z\n")
    monkeypatch.setattr(__import__(__name__), "MODULES", fake)
    edges, _ = _imports()
    assert edges["harness.config.x"] == {"harness.plan"} and edges["harness.plan"] == {"harness.config.x"}
    assert _cycles(edges) == [["harness.config.x", "harness.plan"]]
    assert _layer("harness.config.x") < _layer("harness.plan")  # the config -> plan edge goes up


def test_the_layer_diagram_in_the_docs_is_this_tests_layers():
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    diagram = text[text.index("```\n8  commands"):].split("```")[1]
    shown = {int(line[0]): {n.strip() for n in line[1:].split(",")} for line in diagram.strip().splitlines()}
    wanted = {i: {m.removeprefix("harness.") for m in layer if m != "harness"} for i, layer in enumerate(LAYERS)}
    wanted[8].discard("__main__")
    assert shown == wanted


def _closure(module: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for imported in edges.get(todo.pop(), set()) - seen:
            seen.add(imported)
            todo.append(imported)
    return seen


def test_commands_that_start_no_run_do_not_import_the_run_stack():
    """One serve-sim process per simulated server, and plan, compare and calc on every call: the session pulls
    in the runner, the capacity search and the report, about a second of CPU each time, for nothing."""
    edges, _ = _imports()
    for command in ("serve_sim", "plan", "compare", "calc"):
        reached = _closure(f"harness.commands.{command}", edges)
        assert not reached & {"harness.session", "harness.runner", "harness.capacity"}, (command, sorted(reached))
    assert "harness.session" in _closure("harness.commands.sweep", edges)  # the check sees a real path
