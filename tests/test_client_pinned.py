"""The same simulated point with the blog's EvalScope 1.7.0, pinned and run from its own cached environment
(harness/builds/client.py), and with 1.14.1, the harness's own: each report names its client, and the
server's prompt-token counter shows the reasoning history 1.14 re-sends and 1.7.0 drops (docs/facts.md §6).
The simulated arm runs the blog's --reasoning-parser glm45, so its replies stream half reasoning, half
content. (1.14.1 is what the harness's own environment holds, by its constraints: a pinned 1.14.1 would be
a second build of the same packages through the same code path as 1.7.0's.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sweep_support import ROOT, run_sweep, write_sweep

from harness.builds.client import ensure_client
from harness.records import PointRecord

pytestmark = pytest.mark.slow
MAX_TOKENS = 64  # the sweep's max_tokens: 32 reasoning + 32 content per reply


def _run(tmp_path: Path, evalscope: str | None) -> tuple[PointRecord, str]:
    """The point with `evalscope` pinned, or with the harness's own EvalScope (None)."""
    folder = tmp_path / (evalscope or "own")
    folder.mkdir()
    sweep = write_sweep(folder, {"glm": "serve: {reasoning_parser: glm45}\n"}, [(2, 4)])
    if evalscope:
        sweep.write_text(sweep.read_text().replace("client:\n", f'client:\n  evalscope: "{evalscope}"\n', 1))
    done = run_sweep(sweep, "c")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    run = folder / "results" / "c"
    report = subprocess.run([sys.executable, "-m", "harness", "report", str(run)], capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert report.returncode == 0, report.stderr[-2000:]
    point = PointRecord.model_validate_json((run / "points/glm/c2/point.json").read_bytes())
    return point, (run / "report.md").read_text()


def test_the_blogs_client_drops_the_reasoning_history_that_1_14_re_sends(tmp_path):
    ensure_client("1.7.0")  # built once (a minute or two), then reused from the cache
    blog, blog_report = _run(tmp_path, "1.7.0")
    new, new_report = _run(tmp_path, None)
    assert "Client: EvalScope 1.7.0 (evalscope 1.7.0, from its cached environment)." in blog_report
    assert "Client: EvalScope 1.14.1 (the harness's own environment)." in new_report
    assert blog.evalscope_command[:3] != new.evalscope_command[:3]  # two environments' interpreters
    # both releases' summaries and per-request rows are read
    assert blog.summary.key_set == "<=1.9" and new.summary.key_set == ">=1.10"
    assert (blog.requests.db_schema, new.requests.db_schema) == ("1.7", "1.14")
    assert blog.requests.succeeded == new.requests.succeeded == 8  # 4 conversations x 2 turns
    assert blog.requests.mean_completion_tokens == new.requests.mean_completion_tokens == MAX_TOKENS
    # 4 second turns each re-send the first reply: 1.14 with its reasoning half, 1.7.0 without it
    extra = new.metrics.server_prompt_tokens - blog.metrics.server_prompt_tokens
    assert 4 * MAX_TOKENS // 2 * 0.5 <= extra <= 4 * MAX_TOKENS // 2 * 2, extra
    assert new.requests.mean_prompt_tokens > blog.requests.mean_prompt_tokens


def test_build_accepts_a_sweep_and_makes_its_pinned_client(tmp_path):
    ensure_client("1.7.0")
    sweep = write_sweep(tmp_path, {"glm": ""}, [(1, 1)])
    sweep.write_text(sweep.read_text().replace("client:\n", 'client:\n  evalscope: "1.7.0"\n', 1))
    done = subprocess.run([sys.executable, "-m", "harness", "build", str(sweep)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "client: EvalScope 1.7.0 (reused, " in done.stdout
    assert "engine sim runs in the harness itself; nothing to build" in done.stdout
