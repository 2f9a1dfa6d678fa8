"""`harness dataset build RECIPE` and `harness dataset verify FILE`."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.commands.common import CommandArgs, option, positional
from harness.config import LoadedRecipe, load_recipe
from harness.dataset.cache import ensure_built
from harness.dataset.tokenizer import default_tokenizer_path, load_tokenizer
from harness.dataset.verify import DEFAULT_MAX_SHARED_PREFIX_TOKENS, verify_dataset
from harness.errors import HarnessError


@dataclass(frozen=True)
class DatasetBuildArgs(CommandArgs):
    recipe: Path = positional("a dataset recipe YAML", type=Path)
    conversations: int | None = option("--conversations", "build exactly N conversations instead of the "
                                       "recipe's number", type=int, metavar="N", deprecated=("--number",))
    out: Path | None = option("--out", "also write the file here (its folder must exist)", type=Path, metavar="PATH")
    no_progress: bool = option("--no-progress", "no progress bar on stderr", action="store_true", default=False)


@dataclass(frozen=True)
class DatasetVerifyArgs(CommandArgs):
    file: Path = positional("a built swe_smith JSON file", type=Path)
    tokenizer: str | None = option("--tokenizer", "tokenizer folder, tokenizer.json or hub id (default: the "
                                   "shipped one)", metavar="T")
    trust_remote_code: bool = option("--trust-remote-code", "let a hub tokenizer run its own code",
                                     action="store_true", default=False)
    max_shared_prefix: int | None = option("--max-shared-prefix", "a first-turn prefix this long shared by two "
                                           "conversations is a violation (16)", type=int, metavar="TOKENS")


def register(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="dataset_action", metavar="ACTION", required=True)
    build = actions.add_parser("build", help="build a recipe into a swe_smith JSON file (cached)",
                               description="Build a dataset recipe (datasets/*.yaml) into EvalScope's swe_smith "
                                           "format; reuses the cached file under <recipe dir>/built/ when the "
                                           "recipe and its inputs are unchanged.")
    DatasetBuildArgs.register(build, _run_build)
    verify = actions.add_parser("verify", help="check every turn's length, turn counts and disjoint prefixes",
                                description="Check a built file: bare length of every turn, number of turns, "
                                            "prompt_tokens, and that no two conversations share a prefix. "
                                            "Exit 1 naming the conversation and turn on any violation.")
    DatasetVerifyArgs.register(verify, _run_verify)


def _run_build(args: DatasetBuildArgs) -> int:

    loaded = load_recipe(args.recipe)
    if args.conversations is not None:
        if args.conversations < 1:
            raise HarnessError(f"--conversations must be at least 1, got {args.conversations}")
        loaded = LoadedRecipe(path=loaded.path,
                              recipe=loaded.recipe.model_copy(update={"conversations": args.conversations}))
    built = ensure_built(loaded, min_conversations=0, progress=not args.no_progress, out=args.out)
    print(f"path: {built.path}")
    print(f"conversations: {built.conversations}")
    print(f"total tokens: {built.total_tokens:,}")
    print(f"sha256: {built.sha256}")
    print(f"time: {built.build_s:.2f} s ({'cached' if built.cached else 'built'})")
    return 0


def _run_verify(args: DatasetVerifyArgs) -> int:


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
