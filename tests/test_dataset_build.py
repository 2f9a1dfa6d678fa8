"""Building recipes end to end: exact lengths, counts, disjoint prefixes, rebuilds, cache, EvalScope, errors."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_dataset_units import naive_slice

from harness.cli import main as cli_main
from harness.config import load_recipe
from harness.dataset.cache import ensure_built, read_metadata
from harness.dataset.tokenizer import default_tokenizer_path, load_tokenizer
from harness.dataset.verify import verify_dataset
from harness.errors import HarnessError

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "harness" / "data" / "samples" / "openhands-sample.jsonl"
PAD_FILE = REPO / "harness" / "data" / "samples" / "pad-reasoning.txt"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(default_tokenizer_path())


def write_recipe(folder: Path, name: str = "t", **overrides) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    recipe = {"name": name, "source": {"kind": "sample", "path": str(SAMPLE)},
              "tokenizer": str(default_tokenizer_path()), "pad": {"kind": "synthetic"},
              "first_turn_length": 1200, "subsequent_turn_length": 120, "num_turns": 4,
              "conversations": 12, "assumed_output_length": 32, "seed": 42}
    recipe.update(overrides)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def build(path: Path, min_conversations: int = 0, out: Path | None = None):
    return ensure_built(load_recipe(path), min_conversations, progress=False, out=out)


@pytest.mark.parametrize(("first", "later", "turns"), [(3000, 200, 4), (1200, 37, 6), (5001, 753, 3), (64, 5, 2)])
def test_every_turn_has_the_exact_bare_length(tmp_path, tok, first, later, turns):
    built = build(write_recipe(tmp_path, first_turn_length=first, subsequent_turn_length=later, num_turns=turns,
                               conversations=10))
    data = json.loads(built.path.read_bytes())
    assert built.conversations == len(data["conversations"]) == 10 and not built.cached
    assert built.total_tokens == 10 * (first + (turns - 1) * later)
    report = verify_dataset(built.path, tok)
    assert report.ok, report.violations[:3]
    assert report.turns == 10 * turns and report.tokens_checked == built.total_tokens
    for conversation in data["conversations"]:
        assert len(conversation) == turns
        system, user = conversation[0]["messages"]
        assert (system["role"], user["role"]) == ("system", "user")
        assert tok.count_bare(system["content"]) + tok.count_bare(user["content"]) == first
        assert tok.count_bare(user["content"]) <= first // 2
        assert conversation[0]["prompt_tokens"] == tok.count_chat(conversation[0]["messages"])
        for k, turn in enumerate(conversation[1:], 1):
            assert tok.count_bare(turn["messages"][0]["content"]) == later
            assert turn["prompt_tokens"] == conversation[0]["prompt_tokens"] + k * (32 + later)


def test_lengths_are_exact_where_naive_slicing_overshoots(tmp_path, tok):
    rng = random.Random(7)

    def rare(chars: int) -> str:  # CJK the shipped tokenizer never saw: several byte tokens per character
        return " ".join("".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(5)) for _ in range(chars // 5))

    rows = [{"trajectory_id": f"cjk-{i}", "resolved": 1, "trajectory": [
        {"role": "user", "content": "Issue: " + rare(300)},
        *({"role": "tool", "content": "log " + rare(120)} for _ in range(4))]} for i in range(6)]
    source = tmp_path / "cjk.jsonl"
    source.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    issue, log = rows[0]["trajectory"][0]["content"], rows[0]["trajectory"][1]["content"]
    # lengths at which the blog's encode-slice-decode overshoots on these very texts
    later = next(n for n in range(60, 200) if tok.count_bare(naive_slice(tok, log, n)) > n)
    half = next(n for n in range(150, 400) if tok.count_bare(naive_slice(tok, issue, n)) > n)
    first = 2 * half
    built = build(write_recipe(tmp_path, source={"kind": "jsonl", "path": str(source), "only_resolved": True},
                               first_turn_length=first, subsequent_turn_length=later, num_turns=5, conversations=6))
    report = verify_dataset(built.path, tok)
    assert report.ok, report.violations[:3]
    data = json.loads(built.path.read_bytes())
    later_texts = [turn["messages"][0]["content"] for conv in data["conversations"] for turn in conv[1:]]
    assert all(t.startswith("log ") for t in later_texts)  # real text first, topped up with pad
    assert data["metadata"]["turns"]["later_topped_up_with_pad"] > 0


def test_counts_and_disjoint_prefixes_with_reused_trajectories(tmp_path, tok):
    built = build(write_recipe(tmp_path, conversations=100, num_turns=3), min_conversations=150)
    meta = read_metadata(built.path)
    assert built.conversations == meta["conversations"] == 150  # max(recipe, asked)
    assert meta["source"]["distinct_trajectories"] == 80 and meta["source"]["reused"]
    report = verify_dataset(built.path, tok)
    assert report.ok and report.conversations == 150 and report.turns == 450
    assert report.max_shared_prefix_tokens < 8
    data = json.loads(built.path.read_bytes())
    heads = {tuple(tok.encode_bare(c[0]["messages"][0]["content"])[:8]) for c in data["conversations"]}
    assert len(heads) == 150


def test_local_pad_pool_and_its_synthetic_fallback(tmp_path, tok):
    small = tmp_path / "pad-small.txt"
    small.write_text(PAD_FILE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    built = build(write_recipe(tmp_path, pad={"kind": "local", "paths": [str(small)]}, conversations=12))
    meta = read_metadata(built.path)["pad"]
    assert meta["kind"] == "local" and meta["pool_exhausted"]
    assert 0 < meta["fallback_synthetic_slots"] < meta["slots"] and meta["first_fallback_slot"] > 0
    assert meta["files"][0]["path"] == "pad-small.txt"
    assert verify_dataset(built.path, tok).ok
    data = json.loads(built.path.read_bytes())
    assert "the" in data["conversations"][0][0]["messages"][0]["content"]  # pool text comes first


def test_rebuilds_are_byte_identical_and_cached(tmp_path):
    first = build(write_recipe(tmp_path / "a"))
    second = build(write_recipe(tmp_path / "b"))  # same recipe elsewhere: a separate cache, same bytes
    assert first.path.read_bytes() == second.path.read_bytes() and first.sha256 == second.sha256
    assert first.path.name.startswith("t-") and first.path.parent == tmp_path / "a" / "built"
    again = build(write_recipe(tmp_path / "a"))
    assert again.cached and again.path == first.path and again.sha256 == first.sha256
    first.path.unlink()
    rebuilt = build(write_recipe(tmp_path / "a"))
    assert not rebuilt.cached and rebuilt.sha256 == first.sha256
    changed = build(write_recipe(tmp_path / "a", seed=7))
    assert changed.path != first.path and changed.sha256 != first.sha256
    out = tmp_path / "copy.json"
    copied = build(write_recipe(tmp_path / "a"), out=out)
    assert copied.cached and copied.path == out and out.read_bytes() == first.path.read_bytes()


def test_file_loads_in_evalscopes_own_swe_smith_loader(tmp_path):
    from evalscope.perf.arguments import Arguments
    from evalscope.perf.plugin.datasets.swe_smith import SweSmithDatasetPlugin

    built = build(write_recipe(tmp_path, conversations=6, num_turns=3))
    data = json.loads(built.path.read_bytes())
    args = Arguments(model="glm-agentx", api="openai", dataset="swe_smith", dataset_path=str(built.path),
                     multi_turn=True, dataset_offset=2)
    conversations = list(SweSmithDatasetPlugin(args).build_messages())
    assert len(conversations) == 6
    rotated = data["conversations"][2:] + data["conversations"][:2]
    for loaded, ours in zip(conversations, rotated, strict=True):
        assert [t.messages for t in loaded] == [t["messages"] for t in ours]
        assert [t.is_final for t in loaded] == [False, False, True]


def one_line_error(fn) -> str:
    with pytest.raises(HarnessError) as err:
        fn()
    message = str(err.value)
    assert message and "\n" not in message
    return message


def test_bad_inputs_give_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    msg = one_line_error(lambda: build(write_recipe(tmp_path, tokenizer="./no-such-tokenizer")))
    assert "no-such-tokenizer" in msg
    msg = one_line_error(lambda: build(write_recipe(tmp_path, tokenizer="nobody/no-such-model")))
    assert "hub" in msg
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"trajectory": [{"role": "assistant", "content": "hi"}]}) + "\n", encoding="utf-8")
    msg = one_line_error(lambda: build(write_recipe(tmp_path, source={"kind": "jsonl", "path": str(empty)})))
    assert "no usable trajectory" in msg
    unresolved = tmp_path / "unresolved.jsonl"
    unresolved.write_text(json.dumps({"resolved": 0, "trajectory": [{"role": "user", "content": "task"}]}) + "\n",
                          encoding="utf-8")
    msg = one_line_error(lambda: build(write_recipe(tmp_path, source={"kind": "jsonl", "path": str(unresolved),
                                                                      "only_resolved": True})))
    assert "resolved" in msg
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"trajectory": []}\nnot json\n', encoding="utf-8")
    assert "line 2" in one_line_error(lambda: build(write_recipe(tmp_path, source={"kind": "jsonl",
                                                                                   "path": str(broken)})))
    msg = one_line_error(lambda: build(write_recipe(tmp_path, source={"kind": "hub", "id": "nobody/nothing"})))
    assert "huggingface: nobody/nothing@default branch: not in the local cache" in msg and "offline" in msg
    msg = one_line_error(lambda: build(write_recipe(tmp_path, pad={"kind": "openscience"})))
    assert "OpenScienceReasoning-2" in msg
    msg = one_line_error(lambda: build(write_recipe(tmp_path, first_turn_length=1)))
    assert "first_turn_length 1" in msg
    msg = one_line_error(lambda: build(write_recipe(tmp_path), out=tmp_path / "missing" / "x.json"))
    assert "does not exist" in msg
    assert not list(tmp_path.glob("built/*.json"))  # nothing half-written by any of these


def test_cli_build_and_verify(tmp_path, capsys):
    recipe = write_recipe(tmp_path, conversations=5, num_turns=3)
    assert cli_main(["dataset", "build", str(recipe), "--conversations", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "conversations: 3" in out and "total tokens: 4,320" in out and "built" in out
    path = Path(out.split("path: ", 1)[1].splitlines()[0])
    assert cli_main(["dataset", "verify", str(path), "--tokenizer", str(default_tokenizer_path())]) == 0
    assert "ok" in capsys.readouterr().out
    data = json.loads(path.read_bytes())
    data["conversations"][1][2]["messages"][0]["content"] += " and more"
    data["conversations"][2] = data["conversations"][2][:2]
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(data), encoding="utf-8")
    assert cli_main(["dataset", "verify", str(tampered)]) == 1
    err = capsys.readouterr().err
    assert "conversation 1 turn 3:" in err and "conversation 2: 2 turns, expected 3" in err
    assert cli_main(["dataset", "build", str(recipe), "--out", str(tmp_path / "nope" / "x.json")]) == 2
    assert "output folder" in capsys.readouterr().err


@pytest.mark.parametrize("sigint_at_start", [signal.SIG_DFL, signal.SIG_IGN], ids=["sigint-default", "sigint-ignored"])
def test_interrupted_build_leaves_no_file_under_the_final_name(tmp_path, sigint_at_start):
    # A script's background job starts with SIGINT ignored (and so may pytest itself): the build must stop
    # on SIGINT either way, whatever this test process inherited.
    recipe = write_recipe(tmp_path, first_turn_length=74160, subsequent_turn_length=753, num_turns=13,
                          conversations=216)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "dataset", "build", str(recipe)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint_at_start))
    try:
        seen = ""
        while "building dataset" not in seen:  # the progress bar is up: the build has started
            chunk = proc.stderr.read(1)
            assert chunk, f"build ended before it could be interrupted: {seen}"
            seen += chunk
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert not list(tmp_path.glob("built/*.json"))
