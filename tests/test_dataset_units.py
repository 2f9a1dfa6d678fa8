"""Tokenizer, exact-length fitting, pads and source normalisation (offline, shipped tokenizer)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from harness.dataset.boundaries import cut_at_most, encode_with_boundaries, is_safe_boundary
from harness.dataset.pads import PadSupply, SyntheticPad, TextPool, clean_pad_text, special_token_strings
from harness.dataset.sources import SourceRows, normalise_messages, select_trajectories, trajectory_from_row
from harness.dataset.tokenizer import default_tokenizer_path, load_tokenizer
from harness.errors import HarnessError

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "harness" / "data" / "samples" / "openhands-sample.jsonl"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(default_tokenizer_path())



def naive_slice(tokenizer, text: str, n_tokens: int) -> str:
    """What the blog's builder does: encode, keep the first n ids, decode. Kept to show why it fails."""
    return tokenizer.decode(tokenizer.encode_bare(text)[:n_tokens])

def rare_unicode_text(seed: int, chars: int = 200) -> str:
    """CJK and emoji the shipped tokenizer never saw: each character is several byte tokens."""
    rng = random.Random(seed)
    cjk = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(chars))
    return "Build log: " + " ".join(cjk[i:i + 5] for i in range(0, chars, 5)) + " done 🙂🚀 ok"


def test_shipped_tokenizer_folder_and_json_agree(tok):
    bare_json = load_tokenizer(default_tokenizer_path() / "tokenizer.json")
    messages = [{"role": "system", "content": "You are an agent."},
                {"role": "user", "content": "Fix café → naïve in src/x.py"},
                {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Thanks"}]
    assert tok.render_chat(messages) == bare_json.render_chat(messages)
    assert tok.count_chat(messages) == bare_json.count_chat(messages) > tok.count_bare("Thanks")
    assert tok.render_chat(messages).endswith("<|assistant|>\n")
    text = "def f(x):\n    return x + 1  # ok"
    assert tok.decode(tok.encode_bare(text)) == text
    assert tok.count_bare(text) == len(tok.encode_bare(text)) == tok.count_bare_batch([text, ""])[0]
    assert tok.fingerprint == load_tokenizer(default_tokenizer_path()).fingerprint
    assert len(tok.fingerprint) == 64 and tok.backend.get_vocab_size() == 8192


def test_tokenizer_module_import_is_light():
    code = ("import sys, harness.dataset.tokenizer as t; t.load_tokenizer(t.default_tokenizer_path() / "
            "'tokenizer.json'); print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_tokenizers_fail_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("./no-such-tokenizer", str(tmp_path / "missing" / "tokenizer.json"), "nobody/no-such-model"):
        with pytest.raises(HarnessError) as err:
            load_tokenizer(name)
        assert "\n" not in str(err.value) and "tokenizer" in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(HarnessError, match="no tokenizer.json"):
        load_tokenizer(tmp_path / "empty")


def test_naive_slice_overshoots_where_safe_cuts_do_not(tok):
    text = rare_unicode_text(1)
    overshoots = [n for n in range(5, 120) if tok.count_bare(naive_slice(tok, text, n)) > n]
    assert len(overshoots) > 10, "expected decode-then-encode to overshoot on byte-split characters"
    (enc,) = encode_with_boundaries(tok, [text], [200])
    for n in overshoots:
        cut = cut_at_most(enc, n)
        assert cut is not None and text.startswith(cut[0])
        assert tok.count_bare(cut[0]) == cut[1] <= n


def test_safe_boundaries_split_counts_additively(tok):
    text = json.loads(SAMPLE.read_text(encoding="utf-8").splitlines()[3])["trajectory"][1]["content"]
    (enc,) = encode_with_boundaries(tok, [text], [100000])
    safe = [j for j in range(1, enc.tokens) if enc.safe[j]]
    assert len(safe) > 20
    for j in safe[:: max(1, len(safe) // 25)]:
        i = enc.starts[j]
        assert is_safe_boundary(text, i)
        assert tok.count_bare(text[:i]) == j
        assert tok.count_bare(text[:i]) + tok.count_bare(text[i:]) == tok.count_bare(text)


def test_synthetic_pad_exact_deterministic_and_distinct(tok):
    pad = SyntheticPad(tok, seed=42)
    texts = [pad.take(n, f"slot{n}") for n in (1, 2, 7, 64, 753, 5000)]
    assert tok.count_bare_batch(texts) == [1, 2, 7, 64, 753, 5000]
    assert pad.take(753, "slot753") == texts[4]
    assert SyntheticPad(tok, seed=43).take(753, "slot753") != texts[4]
    supply = PadSupply(kind="synthetic", synthetic=pad)
    slots = [supply.take(40, f"s{k}") for k in range(300)]
    assert set(tok.count_bare_batch(slots)) == {40}
    assert len({tuple(tok.encode_bare(s)[:8]) for s in slots}) == 300  # no two share 8 leading tokens


def test_text_pool_spans_are_exact_disjoint_and_run_out(tok):
    docs = iter(clean_pad_text(p) for p in (REPO / "harness/data/samples/pad-reasoning.txt").read_text().split("\n\n"))
    pool = TextPool(tok, docs)
    spans = []
    while (span := pool.take(500)) is not None:
        spans.append(span)
    assert pool.exhausted and 20 < len(spans) < 200
    assert set(tok.count_bare_batch(spans)) == {500}
    assert len(set(spans)) == len(spans)
    pool_text = "".join(spans)
    assert all(pool_text.count(s) == 1 for s in spans[:10])  # disjoint spans of the stream
    assert pool.documents_used > 100


def test_pad_cleaning_strips_markup_and_special_tokens(tok):
    raw = "<think>\nFirst [gMASK]<sop>step<|user|> then <|im_start|>assistant\n</think>\n\n\n\nAnswer<|endoftext|>."
    cleaned = clean_pad_text(raw, special_token_strings(tok))
    assert cleaned == "First step then assistant\n\nAnswer."
    assert "<|endoftext|>" in special_token_strings(tok)


def test_normalisation_follows_the_blog_builder():
    raw = [{"role": "system", "content": "sys"},
           {"role": "user", "content": [{"type": "text", "text": "issue"}, {"type": "image", "url": "x"},
                                        {"type": "text", "text": "details"}]},
           {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]},
           {"role": "tool", "content": "output", "name": "execute_bash", "tool_call_id": "1"},
           {"role": "function", "content": "dropped"}, {"role": "user", "content": "   "}]
    assert normalise_messages(raw) == [{"role": "system", "content": "sys"},
                                       {"role": "user", "content": "issue\ndetails"},
                                       {"role": "user", "content": "output"}]
    row = {"trajectory_id": "t1", "trajectory": json.dumps(raw), "resolved": 0}
    assert trajectory_from_row(row, 0, only_resolved=False).user_messages == ("issue\ndetails", "output")
    assert trajectory_from_row(row, 0, only_resolved=True) is None
    assert trajectory_from_row({"messages": [{"role": "assistant", "content": "x"}]}, 1, False) is None


def test_selection_is_seeded_and_reuses_when_short():
    rows = [{"trajectory_id": f"r{i}", "trajectory": [{"role": "user", "content": f"task {i}"}]} for i in range(5)]
    pick = select_trajectories(SourceRows(rows), 12, seed=42, only_resolved=False, label="x")
    assert pick.distinct == 5 and len(pick.trajectories) == 12
    assert [t.trajectory_id for t in pick.trajectories[:5]] == [t.trajectory_id for t in pick.trajectories[5:10]]
    again = select_trajectories(SourceRows(rows), 12, seed=42, only_resolved=False, label="x")
    assert again.trajectories == pick.trajectories
    with pytest.raises(HarnessError, match="no usable trajectory with resolved set"):
        select_trajectories(SourceRows(rows), 3, seed=1, only_resolved=True, label="x")
