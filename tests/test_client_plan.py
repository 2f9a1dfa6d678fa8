"""The client as the plan resolves it: a pinned EvalScope's cached command, its version before and after
it is built, EvalScope's offset rotation, and the warning a blog sweep gets with another client."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.builds.client import client_env_dir, requirement
from harness.config import ClientSettings, ConfigError, load_sweep
from harness.loadgen import (
    blog_client_warning,
    conversations_read,
    resolve_client,
    warmed_resends,
    with_offset,
)
from harness.plan import make_plan

ROOT = Path(__file__).resolve().parents[1]


def client(**kw) -> ClientSettings:
    return ClientSettings.model_validate({"max_tokens": 8, "points": [{"concurrency": 1, "conversations": 1}], **kw})


def test_a_pinned_release_runs_from_its_own_environment(tmp_path):
    plan = resolve_client(client(evalscope="1.7.0", nice=10), clients_dir=tmp_path)
    env = client_env_dir("1.7.0", tmp_path)
    assert plan.program == ("nice", "-n", "10", str(env / "bin/python"), "-m", "evalscope.cli.cli")
    assert plan.version == "1.7.0" and plan.source == "evalscope 1.7.0" and plan.env_dir == env
    git = resolve_client(client(evalscope="acd09b44"), clients_dir=tmp_path)
    assert git.version is None  # known once built
    assert requirement("acd09b44") == "evalscope[perf] @ git+https://github.com/modelscope/evalscope.git@acd09b44"
    assert resolve_client(client()).source == "harness"


@pytest.mark.parametrize("bad", ["not a ref!", "1.7.0 extra"])
def test_an_unreadable_client_is_refused(bad):
    with pytest.raises(ValueError, match="cannot read evalscope"):
        client(evalscope=bad)


def test_a_blog_sweep_with_another_client_is_warned_and_the_pinned_one_is_not(tmp_path):
    plan = make_plan(load_sweep(ROOT / "sweeps/tp8.yaml"))
    assert plan.client.version == "1.7.0" and not any(w.startswith("client:") for w in plan.warnings)
    other = resolve_client(client())
    note = blog_client_warning(other, "glm45")
    assert "is not the blog's 1.7.0" in note and "delta.reasoning" in note and "glm45" in note
    assert make_plan(load_sweep(ROOT / "sweeps/sim.yaml")).warnings == ()  # not a GLM-5 vLLM sweep


def test_evalscope_rotation_and_what_later_points_re_send():
    assert conversations_read(2, 3, 4) == [2, 3, 0]
    assert conversations_read(5, 2, 4) == [0, 1]  # an offset past the end does nothing
    assert conversations_read(0, 6, 4) == [0, 1, 2, 3, 0, 1]  # cycles
    blog = [(1, 52, 4), (8, 56, 16), (16, 72, 32), (24, 104, 48), (32, 152, 64)]
    assert warmed_resends(blog, 128) == {32: 36} and warmed_resends(blog, 216) == {}
    argv = ["evalscope", "perf", "--dataset-offset", "52", "--number", "4"]
    assert with_offset(argv, 216) == ["evalscope", "perf", "--dataset-offset", "216", "--number", "4"]


def test_a_shift_retry_cannot_take_spares_from_a_shared_dataset(tmp_path):
    recipe = (ROOT / "datasets/sim-sample.yaml").read_text().replace("../harness/", f"{ROOT}/harness/")
    (tmp_path / "r.yaml").write_text(recipe + "reuse: shared\n")
    sweep = (ROOT / "sweeps/sim.yaml").read_text().replace("../datasets/sim-sample.yaml", "r.yaml")
    sweep = sweep.replace("../launch/", f"{ROOT}/launch/")
    (tmp_path / "s.yaml").write_text(sweep + "max_point_retries: 1\nretry_cache: shift\n")
    with pytest.raises(ConfigError, match="retry_cache shift needs spare conversations"):
        make_plan(load_sweep(tmp_path / "s.yaml"))
    (tmp_path / "s.yaml").write_text(sweep + "max_point_retries: 2\nretry_cache: shift\n")
    (tmp_path / "r.yaml").write_text(recipe)
    need = make_plan(load_sweep(tmp_path / "s.yaml")).dataset
    assert need.retry_reserve == 2 * 30 and need.build_conversations == 30 + 60
