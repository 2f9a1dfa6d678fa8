"""Train the shipped tokenizer: a small byte-level BPE with a GLM-shaped chat template.

It is trained on the shipped sample corpus (and pad text), so every offline path — the
embedded default dataset, the simulated engine's token counts, the tests — counts tokens
with one tokenizer. Output, under harness/data/tokenizers/harness-bpe/:
tokenizer.json, tokenizer_config.json (with the chat template), special_tokens_map.json.

    python tools/make_sample_corpus.py && python tools/train_tokenizer.py

Training is deterministic for a given corpus and `tokenizers` version; run it twice and
compare the bytes (`--check` does that).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from harness.dataset.tokenizer import SIMPLE_CHAT_TEMPLATE  # noqa: E402

CORPUS = REPO_ROOT / "datasets" / "samples" / "openhands-sample.jsonl"
PAD_FILES = sorted((REPO_ROOT / "datasets" / "samples").glob("pad-*.txt"))
OUT_DIR = REPO_ROOT / "datasets" / "tokenizers" / "harness-bpe"
VOCAB_SIZE = 8192
EOS = "<|endoftext|>"
# GLM-shaped control tokens: the template's prefix and role markers are single tokens.
SPECIAL_TOKENS = [EOS, "[gMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
                  "<|observation|>", "<|tool|>"]


def corpus_texts(corpus: Path, pad_files: list[Path]) -> Iterator[str]:
    with corpus.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            for message in row["trajectory"]:
                if message.get("content"):
                    yield message["content"]
                for call in message.get("tool_calls") or []:
                    yield call["function"]["arguments"]
            yield row["model_patch"]
    for path in pad_files:
        yield from path.read_text(encoding="utf-8").split("\n\n")


def train(out_dir: Path, corpus: Path = CORPUS, pad_files: list[Path] | None = None) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=1, show_progress=False,
                                  special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = list(corpus_texts(corpus, PAD_FILES if pad_files is None else pad_files))
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=False)
    added = {str(tokenizer.token_to_id(tok)): {"content": tok, "lstrip": False, "normalized": False,
                                               "rstrip": False, "single_word": False, "special": True}
             for tok in SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
        "chat_template": SIMPLE_CHAT_TEMPLATE,
    }
    special_map = {"eos_token": EOS, "pad_token": EOS, "additional_special_tokens": SPECIAL_TOKENS[1:]}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--check", action="store_true", help="train twice and fail unless the bytes match")
    args = parser.parse_args(argv)
    train(args.out_dir)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            train(Path(tmp))
            for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                if not filecmp.cmp(args.out_dir / name, Path(tmp) / name, shallow=False):
                    print(f"not deterministic: {name} differs between two trainings", file=sys.stderr)
                    return 1
    size = sum((args.out_dir / n).stat().st_size for n in ("tokenizer.json", "tokenizer_config.json",
                                                            "special_tokens_map.json"))
    print(f"wrote {args.out_dir} ({VOCAB_SIZE} tokens, {size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
