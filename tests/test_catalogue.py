"""The metric catalogue is the one declaration of a metric: a metric added there (in a copy of the package)
is a PointMetrics field, a summary.csv column, a row the README's column check asks for, and a rule of both
`compare` and the nightly gate, with no other module touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.catalogue import BY_NAME, CATALOGUE, gated_by_default, metrics, table_metrics
from harness.records import EvalScopeSummary, PointMetrics
from harness.report.compare import METRICS
from harness.summary import COLUMNS

ROOT = Path(__file__).resolve().parents[1]

NEW = '''    _m("energy_j_per_token", "J/token", "GPU energy per generated token", "derived", better="lower",
       rule=("max_ratio", 1.10), label="energy (J/token)", digits=2),
'''

PROBE = '''
from pathlib import Path
from harness.config.nightly import GateThresholds
from harness.nightly.thresholds import METRIC_BETTER
from harness.records import PointMetrics, PointRecord, RunManifest
from harness.report.compare import METRICS
from harness.summary import point_row, summary_columns, undocumented_columns
record = PointRecord(deployment="d", concurrency=1, conversations=1, dataset_offset=0, status="ok", gpus_per_server=8,
                     metrics=PointMetrics(energy_j_per_token=0.42))
row = point_row(record, RunManifest(run_id="r", sweep_name="s", sweep_path="s.yaml", gpus_per_server=8))
print("csv", row["energy_j_per_token"], [c[0] for c in summary_columns()].index("energy_j_per_token") > 0)
print("docs", "energy_j_per_token" in undocumented_columns(Path(README).read_text()))
print("gate", dict(GateThresholds().rules())["energy_j_per_token"].text, METRIC_BETTER["energy_j_per_token"])
print("compare", [m.label for m in METRICS if m.name == "energy_j_per_token"])
'''


def test_a_metric_added_to_the_catalogue_reaches_every_reader(tmp_path):
    copy = tmp_path / "pkg"
    shutil.copytree(ROOT / "harness", copy / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    catalogue = copy / "harness" / "catalogue.py"
    text = catalogue.read_text()
    anchor = '    # EvalScope\'s own summary'
    assert anchor in text
    catalogue.write_text(text.replace(anchor, NEW + anchor, 1))
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run([sys.executable, "-c", f"README = {str(ROOT / 'README.md')!r}\n" + PROBE],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["csv 0.42 True", "docs True", "gate <= 1.10x baseline lower",
                                        "compare ['energy (J/token)']"]
    # the copy, not the checkout, was read: the checkout knows no such metric
    assert "energy_j_per_token" not in BY_NAME


def test_the_records_and_tables_are_the_catalogue():
    assert list(PointMetrics.model_fields) == [m.name for m in metrics("metrics")]
    # EvalScope's summary: every field is catalogued; its TTFT and TPOT are the point's own columns (the
    # metrics' values, the summary's where the metrics lack them)
    assert set(EvalScopeSummary.model_fields) - {"mean_ttft_ms", "mean_tpot_ms"} == {m.name for m in metrics("summary")}
    names = [c.name for c in COLUMNS]
    assert [n for n in names if n in BY_NAME] == [m.name for m in CATALOGUE]
    assert [m.name for m in METRICS] == [m.name for m in table_metrics()]
    assert {m.name for m in gated_by_default()} <= {m.name for m in table_metrics()}
    for m in CATALOGUE:
        assert m.meaning and (m.rule is None or m.better is not None), m.name


def test_vllm_metric_names_are_written_in_one_module():
    """`grep -rn '"vllm:' harness/` finds one module: every other reads the names from it."""
    package = ROOT / "harness"
    holders = sorted(str(p.relative_to(ROOT)) for p in package.rglob("*.py")
                     if '"vllm:' in p.read_text(encoding="utf-8") or "'vllm:" in p.read_text(encoding="utf-8"))
    assert holders == ["harness/vllm_names.py"]
