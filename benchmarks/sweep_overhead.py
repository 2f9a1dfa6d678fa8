"""Time a whole sweep and the harness's own overhead per point (not a test: a measurement).

Overhead of a point = its wall time (health check, scraper start/stop, EvalScope
launch, summary parsing, derivation, writes) minus EvalScope's own run time as the
harness measured it around the subprocess. Target: under 5% of point time.

    python benchmarks/sweep_overhead.py [sweeps/sim.yaml] [--launcher ray|local]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.results import iter_points  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", nargs="?", default="sweeps/sim.yaml")
    parser.add_argument("--launcher", default="ray", choices=["ray", "local"])
    args = parser.parse_args()
    run_id = f"bench-{time.strftime('%Y%m%dT%H%M%S')}"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness", "sweep", args.sweep, "--run-id", run_id,
                           "--launcher", args.launcher], cwd=ROOT, capture_output=True, text=True)
    total_s = time.monotonic() - start
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        return proc.returncode
    rows = []
    for record in iter_points(ROOT / "results" / run_id):
        overhead_s = (record.wall_s or 0) - (record.evalscope_wall_s or 0)
        rows.append((record.deployment, record.parallel, record.wall_s, record.evalscope_wall_s, overhead_s))
    print(f"sweep {args.sweep} ({args.launcher} launcher): total wall {total_s:.1f} s, run {run_id}")
    print(f"{'deployment':28} {'c':>3} {'point_s':>8} {'evalscope_s':>11} {'overhead_s':>10} {'overhead':>8}")
    for dep, c, wall, es, over in rows:
        print(f"{dep:28} {c:>3} {wall:8.2f} {es:11.2f} {over:10.3f} {100 * over / wall:7.2f}%")
    points_s = sum(r[2] for r in rows)
    over_s = sum(r[4] for r in rows)
    print(f"points: {points_s:.1f} s of {total_s:.1f} s total; harness overhead inside points {over_s:.2f} s "
          f"= {100 * over_s / points_s:.2f}% of point time; outside points (dataset, Ray, server starts, "
          f"teardown) {total_s - points_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
