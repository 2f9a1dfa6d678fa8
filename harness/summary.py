"""summary.csv: one row per (deployment, point) of a run, and loading runs into pandas.

Column names are the record field names (harness/records.py) and the metric catalogue's names
(harness/catalogue.py); `summary_columns()` is the one table of names, units and meanings that README.md
copies (a test holds them equal), so they never drift.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from harness.catalogue import CATALOGUE
from harness.errors import HarnessError
from harness.io import atomic_write_text
from harness.records import PointRecord, RunManifest
from harness.results import RunPaths, iter_points, read_manifest

if TYPE_CHECKING:
    import pandas as pd

Kind = Literal["str", "int", "float", "bool"]
Source = Literal["run", "point", "summary", "metrics", "build"]


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    unit: str
    meaning: str
    source: Source


def _c(name: str, kind: Kind, unit: str, meaning: str, source: Source) -> Column:
    return Column(name, kind, unit, meaning, source)


# Order is the CSV column order: the point's identity and outcome, then every catalogue metric
# (harness/catalogue.py, the one declaration of each), then what puts the point in doubt and its build.
# mean_ttft_ms / mean_tpot_ms appear once: the point's metrics value, falling back to EvalScope's summary
# when metrics are absent.
COLUMNS: tuple[Column, ...] = (
    _c("run_id", "str", "", "run folder name (results/<run_id>/)", "run"),
    _c("deployment", "str", "", "deployment name from the sweep file", "point"),
    _c("concurrency", "int", "requests", "offered concurrency (EvalScope --parallel)", "point"),
    _c("conversations", "int", "conversations", "conversations sent (EvalScope --number)", "point"),
    _c("dataset_offset", "int", "conversations", "EvalScope --dataset-offset of the point", "point"),
    _c("status", "str", "", "ok, degraded (more failed requests than max_failed_requests) or failed", "point"),
    _c("reason", "str", "", "why the point failed or is degraded (empty when ok)", "point"),
    _c("failure", "str", "", "the kind of failure when not ok: infrastructure, server, client, not_as_requested, "
       "does_not_fit, requests or interrupted", "point"),
    _c("simulated", "bool", "", "measured on the simulated engine, not a GPU server", "run"),
    _c("gpu_model", "str", "", "GPU model of the servers (manifest)", "run"),
    _c("gpus_per_server", "int", "GPUs", "GPUs per server, from the sweep file (per-GPU divisor)", "point"),
    _c("attempt", "int", "", "attempt number that produced this point", "point"),
    _c("started_unix_s", "float", "s", "point start, Unix time", "point"),
    _c("ended_unix_s", "float", "s", "point end, Unix time", "point"),
    _c("wall_s", "float", "s", "point wall time", "point"),
    _c("server_restarted", "bool", "", "the attempt recorded ran on a server started again (after a crash, or by a retry: see retry)", "point"),
    _c("retry", "str", "", "how a retried point avoided the cache its failed attempt warmed: restart or shift",
       "point"),
    *(_c(m.name, m.kind, m.unit, m.meaning, m.record) for m in CATALOGUE),
    _c("warnings", "str", "", "what puts the point's numbers in doubt, e.g. every scrape failed ('; '-joined)",
       "point"),
    _c("kernel_sha256", "str", "", "sha256 of the bundled HiSparse kernel sources the deployment's server ran "
       "(build.kernels: bundled); empty: vLLM's own kernels", "build"),
)
_BY_NAME = {c.name: c for c in COLUMNS}


def summary_columns() -> list[tuple[str, str, str]]:
    """(name, unit, meaning) of every summary.csv column, in file order."""
    return [(c.name, c.unit, c.meaning) for c in COLUMNS]


def undocumented_columns(doc_text: str) -> list[str]:
    """The summary.csv columns a document's column table lacks (a row `| `name` | ...` each): the check
    that keeps README.md's table in step with the catalogue."""
    return [name for name, _unit, _meaning in summary_columns() if f"| `{name}` |" not in doc_text]


def summary_columns_markdown() -> str:
    """The column table as markdown, for README.md."""
    lines = ["| column | unit | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {unit} | {meaning} |" for name, unit, meaning in summary_columns()]
    return "\n".join(lines) + "\n"


def _value(column: Column, point: PointRecord, manifest: RunManifest) -> object:
    if column.source == "run":
        if column.name == "run_id":
            return manifest.run_id
        if column.name == "simulated":
            return bool(manifest.simulated or point.simulated)
        return getattr(manifest, column.name)
    if column.source == "build":  # the deployment's build record (manifest.json)
        entry = manifest.deployments.get(point.deployment)
        kernel = entry.build.kernel if entry is not None and entry.build is not None else None
        return kernel.source_sha256 if kernel is not None else None
    if column.source == "point":
        value = getattr(point, column.name)
        return ("; ".join(value) or None) if isinstance(value, list) else value
    if column.source == "metrics":
        value = getattr(point.metrics, column.name) if point.metrics is not None else None
        if value is None and column.name in ("mean_ttft_ms", "mean_tpot_ms") and point.summary is not None:
            value = getattr(point.summary, column.name)
        return value
    return getattr(point.summary, column.name) if point.summary is not None else None


def point_row(point: PointRecord, manifest: RunManifest) -> dict[str, object]:
    row = {c.name: _value(c, point, manifest) for c in COLUMNS}
    row["run_id"] = manifest.run_id
    return row


_DTYPES: dict[Kind, str] = {"str": "string", "int": "Int64", "float": "float64", "bool": "boolean"}


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    for c in COLUMNS:
        if c.name not in df.columns:
            df[c.name] = pd.NA
    extra = [name for name in df.columns if name not in _BY_NAME]
    df = df[[c.name for c in COLUMNS] + extra].copy()
    for c in COLUMNS:
        if c.kind == "bool" and str(df[c.name].dtype) != "boolean":
            df[c.name] = df[c.name].astype(object).map(_as_bool)
        if c.kind == "float":
            df[c.name] = pd.to_numeric(df[c.name], errors="coerce").astype("float64")
        else:
            df[c.name] = df[c.name].astype(_DTYPES[c.kind])
    return df.reset_index(drop=True)


def _as_bool(value: object) -> object:
    import pandas as pd

    if isinstance(value, str):
        return {"true": True, "false": False}.get(value.strip().lower(), pd.NA)
    if value is None or pd.isna(value):
        return pd.NA
    return bool(value)


def summary_frame(run_dir: Path) -> pd.DataFrame:
    """The run's points as a typed DataFrame, computed from manifest.json and every point.json."""
    import pandas as pd

    manifest = read_manifest(run_dir)
    rows = [point_row(p, manifest) for p in iter_points(run_dir)]
    return _typed(pd.DataFrame(rows, columns=[c.name for c in COLUMNS]))


def write_summary_csv(run_dir: Path) -> Path:
    """Write results/<run>/summary.csv atomically from the run's point.json files."""
    path = RunPaths(Path(run_dir)).summary_csv
    buffer = io.StringIO()
    summary_frame(run_dir).to_csv(buffer, index=False)
    atomic_write_text(path, buffer.getvalue())
    return path


def _read_summary_csv(path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        # "NA" could be a deployment name: only an empty field is missing
        # pandas 3 reads floats back exactly by default and deprecates the option; pandas 2 needs it
        exact = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}
        raw = pd.read_csv(path, keep_default_na=False, na_values=[""], **exact,
                          dtype={c.name: "string" for c in COLUMNS if c.kind in ("str", "bool")})
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{path}: unreadable summary.csv: {str(exc).splitlines()[0]}") from None
    return _typed(raw)


def _csv_is_current(run_dir: Path) -> bool:
    """summary.csv is read as it is only when it is newer than every point and has every column this
    harness writes (a file an older release wrote is recomputed from the points, which it can read)."""
    csv = RunPaths(run_dir).summary_csv
    if not csv.is_file():
        return False
    try:
        with csv.open(encoding="utf-8") as f:
            header = set(f.readline().strip().split(","))
    except OSError:
        return False
    if not header >= _BY_NAME.keys():
        return False
    newest = max((p.stat().st_mtime for p in run_dir.glob("points/*/[cp][0-9]*/point.json")), default=0.0)
    newest = max(newest, RunPaths(run_dir).manifest.stat().st_mtime if RunPaths(run_dir).manifest.exists()
                 else 0.0)
    return csv.stat().st_mtime >= newest


def load_runs(run_dirs: Iterable[Path | str]) -> pd.DataFrame:
    """One DataFrame for one or several runs (a `run_id` column tells them apart).

    A run's summary.csv is read when it is at least as new as its point.json files;
    otherwise the rows are computed from the points, so a half-finished run loads too.
    """
    import pandas as pd

    frames = []
    for run_dir in (Path(r) for r in run_dirs):
        if not RunPaths(run_dir).manifest.is_file():
            raise HarnessError(f"{run_dir}: not a run folder (no manifest.json)")
        frame = _read_summary_csv(RunPaths(run_dir).summary_csv) if _csv_is_current(run_dir) \
            else summary_frame(run_dir)
        frames.append(frame)
    if not frames:
        return _typed(pd.DataFrame(columns=[c.name for c in COLUMNS]))
    return _typed(pd.concat(frames, ignore_index=True))


def resolve_run_dir(run: str | Path, results_root: Path = Path("results")) -> Path:
    """RUN as the user typed it: a run folder path, or a run id under results/."""
    path = Path(run)
    for candidate in (path, Path(results_root) / str(run)):
        if (candidate / "manifest.json").is_file():
            return candidate
    if path.is_dir():
        raise HarnessError(f"{run}: not a run folder (no manifest.json)")
    raise HarnessError(f"{run}: no such run folder (looked for {path} and {Path(results_root) / str(run)})")


def _number(value: object, digits: int) -> str:
    import pandas as pd

    return "-" if value is None or pd.isna(value) else f"{float(value):,.{digits}f}"


def summary_table(run_dir: Path, frame: pd.DataFrame | None = None) -> str:
    """A compact fixed-width table of a run's points (or of `frame`), for the end of a sweep."""
    df = summary_frame(run_dir) if frame is None else frame
    headers = ("deployment", "c", "status", "tok/s/user", "tok/s/GPU", "occupancy", "batch", "accept", "preempt")
    several = df["run_id"].nunique() > 1
    rows: list[Sequence[str]] = []
    for r in df.sort_values(["run_id", "deployment", "concurrency"]).itertuples(index=False):
        rows.append((f"{r.run_id}/{r.deployment}" if several else str(r.deployment), str(r.concurrency),
                     str(r.status), _number(r.interactivity_tok_s_user, 1), _number(r.total_tok_s_per_gpu, 0),
                     _number(r.occupancy_mean_running, 1), _number(r.decode_batch_mean, 1),
                     _number(r.mtp_acceptance_length, 2),
                     _number(r.preemptions, 0)))
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        rest = [text.rjust(w) for text, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([cells[0].ljust(widths[0])] + rest)

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(row) for row in rows]) + "\n"
