"""`harness serve-sim --launch PROFILE [--host H] [--port P]`: the simulated engine's HTTP server."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from pathlib import Path

from harness.commands.common import CommandArgs, option
from harness.config import load_launch
from harness.config.sim import SimSettings
from harness.dataset.tokenizer import default_tokenizer_path, load_tokenizer
from harness.errors import HarnessError
from harness.sim.server import SimServer, serve


@dataclass(frozen=True)
class ServeSimArgs(CommandArgs):
    launch: Path = option("--launch", "launch profile to simulate, e.g. launch/sim-hisparse.yaml", type=Path,
                          required=True, deprecated=("--profile",))
    host: str | None = option("--host", "address to bind (default: the profile's, 127.0.0.1)")
    port: int | None = option("--port", "port (default: the profile's, else 8000)", type=int)
    time_scale: float | None = option("--time-scale", "simulated seconds per wall second (default: the "
                                      "profile's sim.time_scale)", type=float)
    max_model_len: int | None = option("--max-model-len", "the admission limit (default: the profile's "
                                       "serve.max_model_len), as vLLM's flag of that name", type=int)


def register(parser: argparse.ArgumentParser) -> None:
    ServeSimArgs.register(parser, run)


def run(args: ServeSimArgs) -> int:


    profile = load_launch(args.launch).profile
    sim = profile.sim or SimSettings()
    if args.time_scale is not None:
        if args.time_scale <= 0:
            raise HarnessError(f"--time-scale must be > 0, got {args.time_scale}")
        sim = sim.model_copy(update={"time_scale": args.time_scale})
    profile = profile.model_copy(update={"sim": sim})
    if args.max_model_len is not None:
        profile = profile.model_copy(update={"serve": profile.serve.model_copy(
            update={"max_model_len": args.max_model_len})})
    tokenizer = load_tokenizer(sim.tokenizer or default_tokenizer_path())
    host = args.host or profile.host
    port = args.port if args.port is not None else (profile.port or 8000)
    server = SimServer(profile, tokenizer, log=lambda line: print(line, flush=True))
    try:
        asyncio.run(serve(server, host, port))
    except OSError as exc:
        raise HarnessError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        return 0
    return 0
