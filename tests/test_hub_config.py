"""Hub references in recipes and launch profiles: the `hub:` field, pins, trust_remote_code, and how the
plan and the launchers turn a hub model into a server that loads its node's copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.config import ConfigError, load_launch, load_recipe
from harness.config.hubref import DEFAULT_HUB, HubRef
from harness.servers.base import MODEL_PLACEHOLDER, ServerSpec, ServerStartError, fill_placeholders
from harness.servers.vllm_command import server_command

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SAMPLE = ROOT / "harness" / "data" / "samples" / "openhands-sample.jsonl"


def recipe(tmp_path: Path, **fields) -> Path:
    data = {"name": "r", "source": {"kind": "sample", "path": str(SAMPLE)}, "tokenizer": "org/tok",
            "first_turn_length": 100, "subsequent_turn_length": 10, "num_turns": 2, "conversations": 2, **fields}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def profile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def config_error(load, path: Path) -> str:
    with pytest.raises(ConfigError) as excinfo:
        load(path)
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_recipe_hub_applies_to_bare_ids_and_a_prefix_wins(tmp_path):
    r = load_recipe(recipe(tmp_path, hub="modelscope",
                           source={"kind": "hub", "id": "org/traj", "revision": "v2"},
                           tokenizer={"name": "hf://org/tok", "revision": COMMIT},
                           pad={"kind": "openscience", "id": "org/pad@v3"})).recipe
    assert r.source_ref() == HubRef("modelscope", "org/traj", "v2", "dataset")
    assert r.tokenizer_ref() == HubRef("huggingface", "org/tok", COMMIT, "model")
    assert r.pad_ref() == HubRef("modelscope", "org/pad", "v3", "dataset")
    plain = load_recipe(recipe(tmp_path, tokenizer=str(ROOT / "harness/data/tokenizers/harness-bpe"))).recipe
    assert plain.tokenizer_ref() is None and plain.source_ref() is None and plain.pad_ref() is None
    assert load_recipe(recipe(tmp_path)).recipe.tokenizer_ref().hub == DEFAULT_HUB


def test_recipe_refuses_unpinned_remote_code_and_misplaced_revisions(tmp_path):
    msg = config_error(load_recipe, recipe(tmp_path, tokenizer={"name": "org/tok", "trust_remote_code": True}))
    assert "r.yaml: tokenizer.trust_remote_code: huggingface: org/tok@default branch: trust_remote_code refused: " \
           "no revision is pinned" in msg
    msg = config_error(load_recipe, recipe(tmp_path, tokenizer={"name": "org/tok", "revision": "v1",
                                                                "trust_remote_code": True}))
    assert "a Hugging Face pin must be a 40-hex commit sha" in msg
    # the same tag is a pin on ModelScope, whose tags the harness takes as fixed; a commit anywhere
    load_recipe(recipe(tmp_path, hub="modelscope", tokenizer={"name": "org/tok", "revision": "v1",
                                                              "trust_remote_code": True}))
    load_recipe(recipe(tmp_path, tokenizer={"name": f"org/tok@{COMMIT}", "trust_remote_code": True}))
    msg = config_error(load_recipe, recipe(tmp_path, tokenizer={"name": str(ROOT / "harness/data/tokenizers/harness-bpe"),
                                                                "revision": "v1"}))
    assert "tokenizer: revision is for hub tokenizers" in msg
    msg = config_error(load_recipe, recipe(tmp_path, source={"kind": "sample", "path": str(SAMPLE), "revision": "v1"}))
    assert "source: revision is for hub sources" in msg
    msg = config_error(load_recipe, recipe(tmp_path, source={"kind": "hub", "id": "org/traj@v1", "revision": "v2"}))
    assert "pins revision 'v1' but revision is 'v2'" in msg
    msg = config_error(load_recipe, recipe(tmp_path, hub="github"))
    assert "r.yaml: hub: " in msg


def test_the_shipped_blog_recipe_and_profiles_pin_what_runs_remote_code():
    r = load_recipe(ROOT / "datasets/openhands-glm53.yaml").recipe
    for ref in (r.source_ref(), r.pad_ref(), r.tokenizer_ref()):
        assert ref.hub == "huggingface" and len(ref.revision) == 40
    for name in ("glm53-hisparse", "glm53-offload", "glm53-hisparse-nomtp", "glm53-offload-nomtp"):
        p = load_launch(ROOT / f"launch/{name}.yaml").profile
        assert p.serve.trust_remote_code and p.model_ref.revision == r.tokenizer_ref().revision
        assert p.served_model_name == "glm-agentx"


def test_profile_model_ref_served_name_and_refusals(tmp_path):
    p = load_launch(profile(tmp_path, "hub: modelscope\nserve: {model: ZhipuAI/GLM-5.3, revision: v1.0}\n")).profile
    assert p.model_ref == HubRef("modelscope", "ZhipuAI/GLM-5.3", "v1.0") and p.served_model_name == "ZhipuAI/GLM-5.3"
    rendered = p.served_from(MODEL_PLACEHOLDER)
    assert (rendered.serve.model, rendered.serve.revision, rendered.serve.served_model_name) == \
        (MODEL_PLACEHOLDER, None, "ZhipuAI/GLM-5.3")
    argv = server_command(rendered, tmp_path / "p.yaml", dialect=None, python=None).argv
    assert argv[:3] == ["vllm", "serve", MODEL_PLACEHOLDER] and "--revision" not in argv
    assert argv[argv.index("--served-model-name") + 1] == "ZhipuAI/GLM-5.3"
    # a local path, and the simulated engine (it loads no weights), are never fetched
    assert load_launch(profile(tmp_path, "serve: {model: /models/x}\n")).profile.model_ref is None
    assert load_launch(profile(tmp_path, "engine: sim\nserve: {model: org/x}\n")).profile.model_ref is None
    msg = config_error(load_launch, profile(tmp_path, "serve: {model: org/x, trust_remote_code: true}\n"))
    assert "p.yaml: serve.trust_remote_code: huggingface: org/x@default branch: trust_remote_code refused" in msg
    msg = config_error(load_launch, profile(tmp_path, "serve: {model: /models/x, revision: v1}\n"))
    assert "p.yaml: serve.revision: /models/x is a local path" in msg
    msg = config_error(load_launch, profile(tmp_path, "serve: {model: 'ms://justaname'}\n"))
    assert "p.yaml: serve.model: 'justaname' is not a hub repository id" in msg


def test_the_model_placeholder_is_filled_per_node_or_refused(tmp_path):
    spec = ServerSpec(name="arm", argv=["vllm", "serve", MODEL_PLACEHOLDER, "--port", "{port}"], env={},
                      host="127.0.0.1", port=0, log_path=tmp_path / "log", ready_timeout_s=1, gpus=0,
                      served_model_name="m", model_paths={"node-a": "/a/snap", "node-b": "/b/snap"})
    assert spec.on_node("node-b").argv == ["vllm", "serve", "/b/snap", "--port", "{port}"]
    with pytest.raises(ServerStartError) as excinfo:
        spec.on_node("node-c")
    assert "not fetched onto node node-c (fetched onto: node-a, node-b)" in str(excinfo.value)
    plain = ServerSpec(name="arm", argv=["vllm", "serve", "/m"], env={}, host="h", port=0, log_path=tmp_path,
                       ready_timeout_s=1, gpus=0, served_model_name="m")
    assert plain.on_node("anything") is plain
    assert fill_placeholders(["{model}", "{port}"], model="/x", port=8) == ["/x", "8"]
