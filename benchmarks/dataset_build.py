"""Benchmark: build the blog-scale dataset shape offline and compare with one plain encode.

Shape: 216 conversations x 13 turns, turn 1 exactly 74,160 bare tokens, turns 2..13 exactly
753 (docs/facts.md §5), with the shipped tokenizer, the shipped sample source and synthetic
pad. The reference is the time the same tokenizer takes to encode the output's text once
(every message's content, one parallel `encode_batch_fast`, the fastest way the library
has, which is what the builder's verification uses); the
target is build time <= 2x that. A sequential encode (one `encode` call per message) is
printed too.

    python benchmarks/dataset_build.py [--conversations 216] [--keep PATH]
    python benchmarks/dataset_build.py --first-turn 999748 --turns 1 --conversations 8   # the 1M probe's shape

It also prints the process's peak resident memory (the builder holds the pad pool and each conversation
while it is cut to length).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from harness.config import load_recipe  # noqa: E402
from harness.dataset.cache import ensure_built  # noqa: E402
from harness.dataset.tokenizer import default_tokenizer_path, load_tokenizer  # noqa: E402
from harness.dataset.verify import verify_dataset  # noqa: E402

RECIPE = """\
name: blog-shape-offline
source: {{kind: sample, path: {sample}}}
tokenizer: {tokenizer}
pad: {{kind: synthetic}}
first_turn_length: {first_turn}
subsequent_turn_length: 753
num_turns: {turns}
conversations: {conversations}
assumed_output_length: 220
seed: 42
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=216)
    parser.add_argument("--first-turn", type=int, default=74160, help="bare tokens of turn 1")
    parser.add_argument("--turns", type=int, default=13)
    parser.add_argument("--keep", type=Path, default=None, help="copy the built file here")
    parser.add_argument("--verify", action="store_true", help="also run the independent verifier (slow)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dataset-bench-") as tmp:
        recipe_path = Path(tmp) / "blog-shape.yaml"
        recipe_path.write_text(RECIPE.format(sample=REPO_ROOT / "harness/data/samples/openhands-sample.jsonl",
                                             tokenizer=default_tokenizer_path(),
                                             conversations=args.conversations, first_turn=args.first_turn,
                                             turns=args.turns), encoding="utf-8")
        loaded = load_recipe(recipe_path)
        tokenizer = load_tokenizer(default_tokenizer_path())
        tokenizer.count_bare("warm up")  # thread pool start-up is not the builder's cost

        started = time.perf_counter()
        built = ensure_built(loaded, min_conversations=0, progress=False, out=args.keep)
        build_s = time.perf_counter() - started
        peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB on Linux; before the re-encodes

        data = json.loads(built.path.read_bytes())
        contents = [m["content"] for conv in data["conversations"] for turn in conv for m in turn["messages"]]
        started = time.perf_counter()
        tokens = sum(len(e) for e in tokenizer.backend.encode_batch_fast(contents, add_special_tokens=False))
        batch_s = time.perf_counter() - started
        started = time.perf_counter()
        for text in contents:
            tokenizer.backend.encode(text, add_special_tokens=False)
        sequential_s = time.perf_counter() - started

        print(f"shape: {built.conversations} conversations x {args.turns} turns, {args.first_turn:,} / 753 tokens, "
              f"{tokens:,} bare tokens ({built.total_tokens:,} expected), {built.path.stat().st_size:,} bytes")
        print(f"build: {build_s:.2f} s; peak resident memory {peak_gib:.2f} GiB")
        print(f"encode the output once (encode_batch_fast, parallel): {batch_s:.2f} s  -> build / encode = "
              f"{build_s / batch_s:.2f}x (target <= 2x)")
        print(f"encode the output once (encode per message, sequential): {sequential_s:.2f} s  -> "
              f"build / encode = {build_s / sequential_s:.2f}x")
        if tokens != built.total_tokens:
            print("MISMATCH: the file's token count differs from the builder's", file=sys.stderr)
            return 1
        if args.verify:
            started = time.perf_counter()
            report = verify_dataset(built.path, tokenizer)
            print(f"verify: {'ok' if report.ok else report.violations[:3]} in {time.perf_counter() - started:.2f} s, "
                  f"longest shared first-turn prefix {report.max_shared_prefix_tokens} tokens")
            if not report.ok:
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
