"""Hub inputs through the dataset path, offline: tokenizer, trajectories and pad from ModelScope or
Hugging Face, and the tiny model, each from a cache laid out as the library itself lays it out.

The builds run as a user runs them, in a child process whose environment names the caches and the
offline switches (huggingface_hub reads HF_HUB_CACHE when it is imported). The repositories are
the harness's own tiny model (its tokenizer inside, as GLM-5.3's is), the shipped sample
trajectories as a data set, and a Parquet pad data set with an `output` field.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_hub import COMMIT, make_hf_cache, make_ms_cache, sample_lines

from harness.builds.tiny_model import write_tiny_model
from harness.dataset.tokenizer import load_tokenizer
from harness.dataset.verify import verify_dataset
from harness.hub import HubError, resolve

ROOT = Path(__file__).resolve().parents[1]
HUBS = ("huggingface", "modelscope")
REVISION = {"huggingface": COMMIT, "modelscope": "v1.0"}
MODEL, TRAJECTORIES, PAD = "org/tiny-llama", "org/trajectories", "org/pad-text"


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """The three repositories' files: the tiny model (with its tokenizer), trajectories, pad."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("tiny")
    (folder / "model").mkdir()
    write_tiny_model(folder / "model")
    model = {p.name: p.read_bytes() for p in (folder / "model").iterdir() if p.is_file()}
    trajectories = {"README.md": b"# sample trajectories\n",
                    "data/train-00000-of-00001.jsonl": b"".join(sample_lines(40))}
    text = (ROOT / "harness/data/samples/pad-reasoning.txt").read_text(encoding="utf-8")
    sink = io.BytesIO()
    pq.write_table(pa.table({"output": [p for p in text.split("\n\n") if p.strip()]}), sink)
    pad = {"data/train-00000-of-00001.parquet": sink.getvalue()}
    return {MODEL: model, TRAJECTORIES: trajectories, PAD: pad}


def populate(hub: str, cache: Path, repos: dict[str, dict[str, bytes]], only: tuple[str, ...] | None = None) -> None:
    for repo_id, files in repos.items():
        if only is not None and repo_id not in only:
            continue
        kind = "model" if repo_id == MODEL else "dataset"
        if hub == "huggingface":
            make_hf_cache(cache, repo_id, files, repo_type=kind, commit=REVISION[hub])
        else:
            make_ms_cache(cache, repo_id, files, repo_type=kind, revision=REVISION[hub])


def write_recipe(folder: Path, hub: str, name: str = "hubbed") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rev = REVISION[hub]
    (folder / f"{name}.yaml").write_text(f"""
name: {name}
hub: {hub}
source: {{kind: hub, id: {TRAJECTORIES}, revision: {rev}, split: train}}
tokenizer: {{name: {MODEL}, revision: {rev}}}
pad: {{kind: openscience, id: {PAD}, revision: {rev}, field: output}}
first_turn_length: 600
subsequent_turn_length: 60
num_turns: 3
conversations: 6
assumed_output_length: 16
""")
    return folder / f"{name}.yaml"


def hub_env(caches: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODELSCOPE_", "TRANSFORMERS_"))}
    return {**clean, "HF_HUB_CACHE": str(caches / "huggingface"), "HF_HUB_OFFLINE": "1",
            "MODELSCOPE_CACHE": str(caches / "modelscope"), "MODELSCOPE_OFFLINE": "1"}


def harness(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


@pytest.mark.slow  # builds a dataset through each hub's own client (11-13 s each)
@pytest.mark.parametrize("hub", HUBS)
def test_recipe_builds_offline_from_a_hub_cache_and_an_empty_one_fails_in_one_line(hub, repos, tmp_path):
    populate(hub, tmp_path / "caches" / hub, repos)
    recipe = write_recipe(tmp_path, hub)
    done = harness("dataset", "build", str(recipe), "--no-progress", env=hub_env(tmp_path / "caches"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    built = Path(done.stdout.split("path: ", 1)[1].splitlines()[0])
    data = json.loads(built.read_bytes())
    meta = data["metadata"]
    rev = REVISION[hub]
    for role, repo_id in (("source", TRAJECTORIES), ("pad", PAD), ("tokenizer", MODEL)):
        entry = meta["hub_inputs"][role]
        assert (entry["hub"], entry["id"], entry["revision"], entry["revision_sha"]) == (hub, repo_id, rev, rev)
    assert meta["source"]["files"] == ["data/train-00000-of-00001.jsonl"] and meta["source"]["rows"] == 40
    assert meta["pad"]["documents_used"] > 0 and meta["pad"]["revision_sha"] == rev
    # the tokenizer came from the model repository without its weights, and counts what the build counted
    tok_dir = resolve(f"{'hf' if hub == 'huggingface' else 'ms'}://{MODEL}@{rev}",
                      cache_dir=tmp_path / "caches" / hub, offline=True).local_path
    report = verify_dataset(built, load_tokenizer(tok_dir))
    assert report.ok and report.conversations == 6, report.violations[:3]
    # the tiny model itself, through the same layer
    model = resolve(f"{'hf' if hub == 'huggingface' else 'ms'}://{MODEL}@{rev}", cache_dir=tmp_path / "caches" / hub,
                    offline=True)
    assert json.loads((model.local_path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (model.local_path / "model.safetensors").stat().st_size > 1_000_000

    # the same recipe against an empty cache: one line naming the hub, the id and the revision
    empty = harness("dataset", "build", str(recipe), "--no-progress", env=hub_env(tmp_path / "empty"), cwd=tmp_path)
    assert empty.returncode == 2, empty.stdout + empty.stderr
    line = empty.stderr.strip()
    assert "\n" not in line and f"{hub}: {MODEL}@{rev}: not in the local cache" in line and "offline" in line
    # only the model (and its tokenizer) in the cache: inputs pinned to their revision name the cache key
    # without being read, so the built file is reused; a recipe not built yet names the missing source
    populate(hub, tmp_path / "partial" / hub, repos, only=(MODEL,))
    reused = harness("dataset", "build", str(recipe), "--no-progress", env=hub_env(tmp_path / "partial"), cwd=tmp_path)
    assert reused.returncode == 0 and "(cached)" in reused.stdout, reused.stderr
    fresh = write_recipe(tmp_path / "fresh", hub)
    partial = harness("dataset", "build", str(fresh), "--no-progress", env=hub_env(tmp_path / "partial"), cwd=tmp_path)
    assert partial.returncode == 2, partial.stdout
    assert "\n" not in partial.stderr.strip()
    assert f"source {hub}: {TRAJECTORIES}@{rev}: not in the local cache" in partial.stderr
    with pytest.raises(HubError) as excinfo:
        resolve(f"{'hf' if hub == 'huggingface' else 'ms'}://{MODEL}@{rev}", cache_dir=tmp_path / "empty",
                offline=True)
    assert f"{hub}: {MODEL}@{rev}: not in the local cache" in str(excinfo.value)


KEY_CODE = """
import json, sys
from harness.config import load_recipe
from harness.dataset.cache import cache_key_material, ensure_built, hub_inputs, read_metadata
from harness.dataset.tokenizer import load_tokenizer_cached
out = {}
for path in sys.argv[1:]:
    loaded = load_recipe(path)
    r = loaded.recipe
    built = ensure_built(loaded, 0, progress=False)
    tok = load_tokenizer_cached(r.tokenizer.name, r.tokenizer.trust_remote_code, r.tokenizer.revision, r.hub)
    data = json.loads(built.path.read_bytes())
    out[r.hub] = {"material": cache_key_material(loaded, built.conversations, tok, hub_inputs(loaded, tok)),
                  "key": read_metadata(built.path)["cache_key"], "conversations": data["conversations"],
                  "content_sha256": data["metadata"]["content_sha256"]}
print(json.dumps(out))
"""


def leaves(value, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for key, inner in value.items():
            out.update(leaves(inner, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: value}


def test_same_files_from_either_hub_build_the_same_conversations_under_keys_that_differ_by_hub_and_revision(
        repos, tmp_path):
    for hub in HUBS:
        populate(hub, tmp_path / "caches" / hub, repos)
    recipes = [str(write_recipe(tmp_path / hub, hub, name="same")) for hub in HUBS]
    done = subprocess.run([sys.executable, "-c", KEY_CODE, *recipes], capture_output=True, text=True,
                          env=hub_env(tmp_path / "caches"), cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    hf, ms = got["huggingface"], got["modelscope"]
    assert hf["conversations"] == ms["conversations"] and hf["content_sha256"] == ms["content_sha256"]
    assert hf["key"] != ms["key"]
    a, b = leaves(hf["material"]), leaves(ms["material"])
    assert set(a) == set(b)
    differing = {k for k in a if a[k] != b[k]}
    # the hub and the revision of each hub input, as the recipe writes them and as they were read; the
    # tokenizer's bytes (its fingerprint), the source's split, the pad's field and the rest are the same
    assert differing == {"recipe.hub", "recipe.source.revision", "recipe.tokenizer.revision", "recipe.pad.revision",
                         "source.hub", "source.revision_sha", "pad_source.hub", "pad_source.revision_sha"}
