"""`harness calc`: the blog's concurrency calculator (baseline vs Hybrid HiSparse)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from harness.calc import CalcInputs, calculate, calculate_range, find_crossover, inputs_for_launch
from harness.calc.formulas import OLD_LAYOUT_NAMES, Layout
from harness.calc.plot import chart_format, plot_concurrency
from harness.calc.render import (
    format_range,
    format_result,
    parse_seq_range,
    parse_tokens,
    plot_grid,
    table_grid,
)
from harness.commands.common import CommandArgs, option
from harness.config import load_launch
from harness.errors import HarnessError

# (flag, CalcInputs field, kind, help); numbers are read here, not by argparse, so that a bad
# value is one line on stderr like every other input error.
_INPUT_OPTIONS: list[tuple[str, str, str, str]] = [
    ("--gpu", "gpu", "str", "H200, B200 or B300 (default H200)"),
    ("--hbm-gib", "hbm_gib", "float", "HBM per GPU in GiB, instead of --gpu"),
    ("--gpus", "gpus", "int", "GPUs in the deployment (default TP x DP)"),
    ("--tp", "tp", "int", "tensor parallel size (default 8)"),
    ("--dp", "dp", "int", "data parallel size (default GPUs / TP, or 1)"),
    ("--gpu-memory-utilization", "gpu_memory_utilization", "float", "default 0.92"),
    ("--runtime-reserve-gib", "runtime_reserve_gib", "float", "vLLM runtime + headroom per GPU (default 15)"),
    ("--kv-hbm-gib", "kv_hbm_gib", "float", "KV HBM per GPU as vLLM reports it (default: estimated)"),
    ("--max-num-seqs", "max_num_seqs", "int", "per DP replica (default 1024)"),
    ("--kv-dtype", "kv_dtype", "str", "fp8 or bf16 (default fp8)"),
    ("--hot-rows", "hot_rows", "int", "hot-buffer rows per request (default 4096, or (n+2) x 2048 with MTP)"),
    ("--speculative-tokens", "speculative_tokens", "int", "MTP tokens n; sets the default hot rows"),
    ("--hot-groups", "hot_groups", "int", "default 20"),
    ("--retained-pages", "retained_pages", "int", "retained pages per hot group (default 2)"),
    ("--host-pool-gib", "host_pool_gib", "float", "HiSparse host pool per DP replica (default: the minimum)"),
    ("--indexer-offload-gib", "indexer_offload_gib", "float", "offload pool, total (default 128)"),
    ("--host-ram-gib", "host_ram_gib", "float", "host RAM budget (default: not limiting)"),
]
_SWITCHES: list[tuple[str, str, bool, str]] = [
    ("--no-expert-parallel", "expert_parallel", False, "routed experts sharded over TP only"),
    ("--no-tp-host-sharing", "tp_host_sharing", False, "one host pool per TP rank instead of per DP replica"),
    ("--no-hisparse", "hisparse_enabled", False, "the deployment runs without HiSparse (predicted = baseline)"),
]


@dataclass(frozen=True)
class CalcArgs(CommandArgs):
    seq_len: str | None = option("--seq-len", "tokens per request (default 81920; with --from-launch: "
                                 "serve.max_model_len)", metavar="TOKENS")
    seq_range: str | None = option("--seq-range", "print (and with --out draw) both modes from START to END "
                                   "tokens, e.g. 8192:1048576", metavar="START:END")
    out: Path | None = option("--out", "chart file for --seq-range, .png or .svg", type=Path, metavar="FILE",
                              deprecated=("--plot",))
    from_launch: str | None = option("--from-launch", "take the inputs from a launch profile YAML",
                                     metavar="PROFILE")
    layout: str | None = option("--layout", "unscaled (the calculator page's 576-byte rows, no scale bytes; "
                                "default) or vllm (the 656-byte fp8 rows vLLM stores; default with --from-launch)")
    json: bool = option("--json", "print JSON instead of a table", action="store_true", default=False)
    # the deployment inputs given (not with --from-launch), as the calculator names them
    inputs: dict[str, object] = dataclasses.field(default_factory=dict)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        super().add_cli_args(parser)
        inputs = parser.add_argument_group("deployment inputs (not with --from-launch)")
        for flag, dest, kind, help_text in _INPUT_OPTIONS:
            metavar = ("GIB" if dest.endswith("_gib") else "FRACTION" if kind == "float"
                       else "N" if kind == "int" else dest.upper())
            inputs.add_argument(flag, dest=f"in_{dest}", metavar=metavar, default=None, help=help_text)
        for flag, dest, value, help_text in _SWITCHES:
            inputs.add_argument(flag, dest=f"in_{dest}", action="store_const", const=value, default=None,
                                help=help_text)

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> CalcArgs:
        return dataclasses.replace(super().from_cli_args(ns), inputs=_given_inputs(ns))


def register(parser: argparse.ArgumentParser) -> None:
    CalcArgs.register(parser, run)


def _number(text: str, flag: str, kind: str) -> int | float:
    try:
        value = float(text) if kind == "float" else int(text)
    except ValueError:
        raise HarnessError(f"{flag}: {text!r} is not {'a number' if kind == 'float' else 'a whole number'}") \
            from None
    if isinstance(value, float) and not math.isfinite(value):
        raise HarnessError(f"{flag}: {text!r} is not a finite number")
    return value


def _given_inputs(args: argparse.Namespace) -> dict[str, object]:
    given: dict[str, object] = {}
    for flag, dest, kind, _help in _INPUT_OPTIONS:
        text = getattr(args, f"in_{dest}")
        if text is not None:
            given[dest] = text if kind == "str" else _number(text, flag, kind)
    for _flag, dest, _value, _help in _SWITCHES:
        if getattr(args, f"in_{dest}") is not None:
            given[dest] = getattr(args, f"in_{dest}")
    return given


def run(args: CalcArgs) -> int:
    given = dict(args.inputs)
    if args.layout in OLD_LAYOUT_NAMES:
        print(f"--layout {args.layout}: deprecated: now --layout {OLD_LAYOUT_NAMES[args.layout]}", file=sys.stderr)
        args = dataclasses.replace(args, layout=OLD_LAYOUT_NAMES[args.layout])
    if args.layout is not None and args.layout not in get_args(Layout):
        raise HarnessError(f"--layout: {args.layout!r} is not a layout; use unscaled or vllm")
    if args.seq_len is not None and args.seq_range is not None:
        raise HarnessError("--seq-len and --seq-range exclude each other")
    if args.out is not None and args.seq_range is None:
        raise HarnessError("--out draws a range: give --seq-range START:END as well")
    seq_len = parse_tokens(args.seq_len, "--seq-len") if args.seq_len is not None else None
    seq_range = parse_seq_range(args.seq_range) if args.seq_range is not None else None
    if args.out is not None:
        chart_format(args.out)

    if args.from_launch is not None:

        if given:
            flags = [opt[0] for opt in (*_INPUT_OPTIONS, *_SWITCHES) if opt[1] in given]
            raise HarnessError(f"{', '.join(flags)}: not with --from-launch; the profile sets these")
        profile = load_launch(args.from_launch).profile
        length = seq_len or (seq_range[0] if seq_range else None) or profile.serve.max_model_len or 81_920
        inputs = inputs_for_launch(profile, length, args.layout or "vllm")
    else:
        if args.layout is not None:
            given["layout"] = args.layout
        if seq_len is not None:
            given["seq_len"] = seq_len
        inputs = CalcInputs.build(**given)

    if seq_range is None:
        result = calculate(inputs)
        print(result.model_dump_json(indent=2) if args.json else format_result(result))
        return 0

    lo, hi = seq_range
    crossover = find_crossover(inputs, lo, hi)
    rows = calculate_range(inputs, table_grid(lo, hi))
    if args.json:
        print(json.dumps({"crossover_seq_len": crossover,
                          "results": [r.model_dump(mode="json") for r in rows]}, indent=2))
    else:
        print(format_range(rows, crossover))
    if args.out is not None:
        written = plot_concurrency(calculate_range(inputs, plot_grid(lo, hi)), crossover, args.out)
        if not args.json:
            print(f"chart: {written}")
    return 0
