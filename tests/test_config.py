"""Config loading: every shipped file loads; every mistake is one line naming file and field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.config import (
    ConfigError,
    load_launch,
    load_recipe,
    load_sweep,
)
from harness.schema import parse_size_bytes

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_every_sweep_loads(path):
    loaded = load_sweep(path)
    assert loaded.sweep.deployments


@pytest.mark.parametrize("path", sorted((ROOT / "launch").glob("*.yaml")), ids=lambda p: p.name)
def test_every_launch_profile_loads(path):
    assert load_launch(path).profile.serve.model


@pytest.mark.parametrize("path", sorted((ROOT / "datasets").glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_loads(path):
    assert load_recipe(path).recipe.num_turns >= 1


def test_extends_overrides_and_removes():
    mtp = load_launch(ROOT / "launch/glm53-hisparse.yaml").profile
    nomtp = load_launch(ROOT / "launch/glm53-hisparse-nomtp.yaml")
    assert mtp.speculative is not None and nomtp.profile.speculative is None
    assert nomtp.profile.kv == mtp.kv and nomtp.profile.serve == mtp.serve
    assert [p.name for p in nomtp.files] == ["glm53-hisparse-nomtp.yaml", "glm53-hisparse.yaml"]
    base = load_launch(ROOT / "launch/glm53-offload-nomtp.yaml").profile
    assert base.kv.hisparse is None and base.kv.offload.cpu_bytes == 512 * 2**30 and base.speculative is None


def test_sizes():
    assert parse_size_bytes("128GiB") == 137438953472
    assert parse_size_bytes(549755813888) == 549755813888
    assert parse_size_bytes("1.5 KiB") == 1536
    assert parse_size_bytes("2GB") == 2 * 10**9
    for bad in ("lots", "-5GiB", "1.5", True):
        with pytest.raises(ValueError):
            parse_size_bytes(bad)


# ---------------------------------------------------------------- one-line errors

LAUNCH_OK = """
engine: vllm
build: {vllm: "==0.33.0"}
serve: {model: m, tensor_parallel_size: 1}
kv:
  hisparse: {host_pool_gib: 16}
  offload: {cpu_bytes: 1GiB}
"""

RECIPE_OK = """
name: r
source: {kind: hub, id: a/b}
tokenizer: a/b
first_turn_length: 100
subsequent_turn_length: 10
num_turns: 2
conversations: 8
"""


def _sweep(launch: str = "l.yaml", points: str = "points: [{concurrency: 1, conversations: 2}]") -> str:
    return f"""
name: s
dataset: r.yaml
gpus_per_server: 1
client:
  max_tokens: 8
  {points}
deployments:
  - {{name: a, launch: l.yaml}}
  - {{name: b, launch: {launch}}}
"""


def _write(tmp_path: Path, launch: str = LAUNCH_OK, sweep: str | None = None) -> Path:
    (tmp_path / "l.yaml").write_text(launch)
    (tmp_path / "r.yaml").write_text(RECIPE_OK)
    (tmp_path / "s.yaml").write_text(sweep if sweep is not None else _sweep())
    return tmp_path / "s.yaml"


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_valid_minimal_files_load(tmp_path):
    loaded = load_sweep(_write(tmp_path))
    assert list(loaded.launches) == ["a", "b"]


def test_unknown_key(tmp_path):
    msg = _error(_write(tmp_path, launch=LAUNCH_OK + "colour: blue\n"))
    assert msg.endswith("l.yaml: colour: unknown key (not part of this file's schema)")


def test_missing_file(tmp_path):
    msg = _error(_write(tmp_path, sweep=_sweep(launch="../launch/x.yaml")))
    assert "s.yaml: deployments[1].launch: no such file" in msg and msg.endswith("launch/x.yaml")


def test_wrong_type(tmp_path):
    msg = _error(_write(tmp_path, launch=LAUNCH_OK.replace("tensor_parallel_size: 1", "tensor_parallel_size: two")))
    assert "l.yaml: serve.tensor_parallel_size:" in msg and "'two'" in msg


def test_negative_pool_size(tmp_path):
    msg = _error(_write(tmp_path, launch=LAUNCH_OK.replace("host_pool_gib: 16", "host_pool_gib: -4")))
    assert "l.yaml: kv.hisparse.host_pool_gib: Input should be greater than 0" in msg
    msg = _error(_write(tmp_path, launch=LAUNCH_OK.replace("cpu_bytes: 1GiB", "cpu_bytes: -1GiB")))
    assert "l.yaml: kv.offload.cpu_bytes:" in msg and "negative" in msg


def test_an_arm_names_only_the_clients_concurrencies(tmp_path):
    points = "points: [{concurrency: 1, conversations: 2}, {concurrency: 4, conversations: 8}]"
    two_arms = _sweep(points=points)
    msg = _error(_write(tmp_path, sweep=two_arms.replace("{name: b, launch: l.yaml}", "{name: b, launch: l.yaml, concurrencies: [4, 2]}")))
    assert msg.endswith("s.yaml: deployments[1].concurrencies: 2 is not one of the client's points (c1, c4)")
    msg = _error(_write(tmp_path, sweep=two_arms.replace("{name: a, launch: l.yaml}", "{name: a, launch: l.yaml, concurrencies: []}")))
    assert msg.endswith("s.yaml: deployments[0].concurrencies: give at least one value, or leave it out for every point")
    msg = _error(_write(tmp_path, sweep=two_arms.replace("{name: a, launch: l.yaml}", "{name: a, launch: l.yaml, concurrencies: [4, 4]}")))
    assert msg.endswith("s.yaml: deployments[0].concurrencies: a value appears twice")
    loaded = load_sweep(_write(tmp_path, sweep=two_arms.replace("{name: a, launch: l.yaml}",
                                                                 "{name: a, launch: l.yaml, concurrencies: [4]}")))
    assert loaded.sweep.concurrencies_of("a") == [4] and loaded.sweep.concurrencies_of("b") == [1, 4]


def test_a_contexts_list_is_named_once_in_its_errors(tmp_path):
    sweep = _sweep()
    msg = _error(_write(tmp_path, sweep=sweep.replace("deployments:", "contexts: [100, 100]\ndeployments:")))
    assert msg.endswith("s.yaml: contexts: a length appears twice")
    msg = _error(_write(tmp_path, sweep=sweep.replace("deployments:", "contexts: []\ndeployments:")))
    assert msg.endswith("s.yaml: contexts: give at least one length, or leave it out for the recipe's first_turn_length")


def test_unequal_point_lists(tmp_path):
    msg = _error(_write(tmp_path, sweep=_sweep(points="parallel: [1, 8]\n  number: [4, 16, 32]")))
    assert "s.yaml: client:" in msg and "concurrency has 2 values but conversations has 3" in msg


@pytest.mark.parametrize("snippet,field,words", [
    ("kv_cache_dtype: hybrid_hisparse", "serve", "hybrid_hisparse does not exist in any vLLM"),
    ("kv_cache_profiling_window: 128", "serve", "no vLLM has --kv-cache-profiling-window"),
    ("swap_space: 384", "serve", "swap_space is not a HiSparse pool"),
])
def test_invented_flags_are_refused(tmp_path, snippet, field, words):
    launch = LAUNCH_OK.replace("tensor_parallel_size: 1}", "tensor_parallel_size: 1, " + snippet + "}")
    msg = _error(_write(tmp_path, launch=launch))
    assert f"l.yaml: {field}:" in msg and words in msg


def test_invented_flag_in_extra_args(tmp_path):
    msg = _error(_write(tmp_path, launch=LAUNCH_OK + "extra_args: ['--kv-cache-dtype=hybrid_hisparse']\n"))
    assert "l.yaml: extra_args:" in msg and "hybrid_hisparse" in msg


def test_hisparse_on_a_build_older_than_030(tmp_path):
    msg = _error(_write(tmp_path, launch=LAUNCH_OK.replace("==0.33.0", "==0.29.0")))
    assert "l.yaml:" in msg and "first shipped in vLLM 0.30.0" in msg


def test_duplicate_concurrency(tmp_path):
    msg = _error(_write(tmp_path, sweep=_sweep(points="points: [{concurrency: 2, conversations: 2}, {concurrency: 2, conversations: 4}]")))
    assert "s.yaml: client:" in msg and "concurrency 2 appears in two points" in msg


def test_gpus_per_server_must_match_profile(tmp_path):
    msg = _error(_write(tmp_path, launch=LAUNCH_OK.replace("tensor_parallel_size: 1", "tensor_parallel_size: 8")))
    assert "s.yaml: deployments[0].launch: gpus_per_server is 1" in msg


def test_bad_yaml_names_line(tmp_path):
    msg = _error(_write(tmp_path, sweep="name: s\nclient: [unclosed\n"))
    assert "s.yaml: line" in msg and "invalid YAML" in msg


def test_extends_cycle_and_missing_parent(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="extends cycle"):
        load_launch(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"c.yaml: extends: no such file"):
        load_launch(tmp_path / "c.yaml")


def test_cli_prints_one_line_and_exits_2(tmp_path):
    path = _write(tmp_path, launch=LAUNCH_OK + "colour: blue\n")
    out = subprocess.run([sys.executable, "-m", "harness", "plan", str(path)], capture_output=True, text=True)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "colour: unknown key" in out.stderr
    assert "Traceback" not in out.stderr


def test_cli_usage_errors_exit_2():
    for argv in (["nonsense"], ["plan", "--bogus-flag", "x.yaml"]):
        out = subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True)
        assert out.returncode == 2 and "usage:" in out.stderr


# ---------------------------------------------------------------- property: never anything but ConfigError

yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
KEYS = ["name", "dataset", "gpus_per_server", "client", "deployments", "scrape", "points", "concurrency",
        "conversations", "max_tokens", "launch", "engine", "serve", "kv", "hisparse", "host_pool_gib", "model",
        "extends", "build", "vllm", "speculative", "on_point_failure", "x"]
yaml_values = st.recursive(
    yaml_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children,
                                               max_size=5)),
    max_leaves=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.dictionaries(st.sampled_from(KEYS), yaml_values, max_size=8), raw=st.booleans(),
       text=st.text(max_size=60))
def test_random_documents_load_or_raise_config_error(tmp_path, doc, raw, text):
    (tmp_path / "l.yaml").write_text(LAUNCH_OK)
    (tmp_path / "r.yaml").write_text(RECIPE_OK)
    content = text if raw else yaml.safe_dump(doc)
    for name in ("fuzz-sweep.yaml", "fuzz-launch.yaml", "fuzz-recipe.yaml"):
        (tmp_path / name).write_text(content)
    for loader, name in ((load_sweep, "fuzz-sweep.yaml"), (load_launch, "fuzz-launch.yaml"),
                         (load_recipe, "fuzz-recipe.yaml")):
        try:
            loader(tmp_path / name)
        except ConfigError as exc:
            assert "\n" not in str(exc)


def test_evalscopes_names_for_points_are_still_read_and_said_to_be_old(tmp_path, capsys):
    """`parallel`/`number` (EvalScope's flags) were the config's names for concurrency and conversations."""
    path = _write(tmp_path, sweep=_sweep(points="points: [{parallel: 2, number: 4}]"))
    loaded = load_sweep(path)
    assert [(p.concurrency, p.conversations) for p in loaded.sweep.client.point_list] == [(2, 4)]
    err = capsys.readouterr().err
    assert "deprecated: client.points: `parallel` is now `concurrency`" in err
    assert "deprecated: client.points: `number` is now `conversations`" in err
