"""`harness dataset build RECIPE` and `harness dataset verify FILE`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.config import LoadedRecipe, load_recipe
from harness.dataset.cache import ensure_built
from harness.dataset.tokenizer import default_tokenizer_path, load_tokenizer
from harness.dataset.verify import DEFAULT_MAX_SHARED_PREFIX_TOKENS, verify_dataset
from harness.errors import HarnessError


def register(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="dataset_action", metavar="ACTION", required=True)

    build = actions.add_parser("build", help="build a recipe into a swe_smith JSON file (cached)",
                               description="Build a dataset recipe (datasets/*.yaml) into EvalScope's swe_smith "
                                           "format; reuses the cached file under <recipe dir>/built/ when the "
                                           "recipe and its inputs are unchanged.")
    build.add_argument("recipe", type=Path, help="a dataset recipe YAML")
    build.add_argument("--number", type=int, default=None, metavar="N",
                       help="build exactly N conversations instead of the recipe's number")
    build.add_argument("--out", type=Path, default=None, metavar="PATH",
                       help="also write the file here (its folder must exist)")
    build.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    build.set_defaults(run=run_build)

    verify = actions.add_parser("verify", help="check every turn's length, turn counts and disjoint prefixes",
                                description="Check a built file: bare length of every turn, number of turns, "
                                            "prompt_tokens, and that no two conversations share a prefix. "
                                            "Exit 1 naming the conversation and turn on any violation.")
    verify.add_argument("file", type=Path, help="a built swe_smith JSON file")
    verify.add_argument("--tokenizer", default=None, metavar="T",
                        help="tokenizer folder, tokenizer.json or hub id (default: the shipped one)")
    verify.add_argument("--trust-remote-code", action="store_true")
    verify.add_argument("--max-shared-prefix", type=int, default=None, metavar="TOKENS",
                        help="a first-turn prefix this long shared by two conversations is a violation (16)")
    verify.set_defaults(run=run_verify)


def run_build(args: argparse.Namespace) -> int:

    loaded = load_recipe(args.recipe)
    if args.number is not None:
        if args.number < 1:
            raise HarnessError(f"--number must be at least 1, got {args.number}")
        loaded = LoadedRecipe(path=loaded.path, recipe=loaded.recipe.model_copy(update={"conversations": args.number}))
    built = ensure_built(loaded, min_conversations=0, progress=not args.no_progress, out=args.out)
    print(f"path: {built.path}")
    print(f"conversations: {built.conversations}")
    print(f"total tokens: {built.total_tokens:,}")
    print(f"sha256: {built.sha256}")
    print(f"time: {built.build_s:.2f} s ({'cached' if built.cached else 'built'})")
    return 0


def run_verify(args: argparse.Namespace) -> int:


    tokenizer = load_tokenizer(args.tokenizer or default_tokenizer_path(), args.trust_remote_code)
    limit = args.max_shared_prefix if args.max_shared_prefix is not None else DEFAULT_MAX_SHARED_PREFIX_TOKENS
    report = verify_dataset(args.file, tokenizer, max_shared_prefix_tokens=limit)
    print(f"{report.path}: {report.conversations} conversations, {report.turns} turns, "
          f"{report.tokens_checked:,} tokens checked, longest shared first-turn prefix "
          f"{report.max_shared_prefix_tokens} tokens")
    if report.ok:
        print("ok")
        return 0
    for violation in report.violations[:50]:
        print(f"violation: {violation}", file=sys.stderr)
    if len(report.violations) > 50:
        print(f"... and {len(report.violations) - 50} more", file=sys.stderr)
    return 1
