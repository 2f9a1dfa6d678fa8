"""One setup on the simulated engine: a launch profile, a client point and its conversations, run in
virtual time with trial profiles; what the server histograms and EvalScope would report for it."""

from __future__ import annotations

from dataclasses import dataclass

from harness.config import DatasetRecipe, LaunchProfile
from harness.sim.counters import Histogram
from harness.sim.engine import Engine
from harness.sim.engine_config import engine_config
from harness.sim.profiles import HardwareProfile, ModelProfile
from harness.sim.virtual import ConversationShape, run_point, shapes_from_recipe
from harness.simulate import evalscope_like_summary


@dataclass(frozen=True)
class PointSetup:
    """What a measured point ran: the arm, the client's concurrency and conversations."""

    name: str                                  # e.g. "cpu-baseline:c4", or a measurement's id
    profile: LaunchProfile
    model: ModelProfile                        # the simulator's description of the model it serves
    shapes: tuple[ConversationShape, ...]      # the conversations, in the order the client sends them
    concurrency: int
    conversations: int
    max_tokens: int


@dataclass(frozen=True)
class Prediction:
    tpot_ms: float | None         # the server's TPOT histogram mean (= EvalScope's TPOT in virtual time)
    prefill_ms: float | None      # the server's prefill-time histogram mean
    ttft_ms: float | None
    total_tok_s: float | None     # EvalScope's total throughput
    preemptions: int
    mtp_acceptance_length: float | None
    hisparse_hit_rate: float | None
    simulated_s: float

    def value(self, quantity: str) -> float | None:
        return getattr(self, quantity)


def recipe_shapes(recipe: DatasetRecipe, offset: int, conversations: int) -> tuple[ConversationShape, ...]:
    """The `conversations` conversations a point at `offset` sends, keyed as the sweep keys them."""
    return tuple(shapes_from_recipe(recipe, offset + conversations)[offset:])


def single_turn_shapes(input_tokens: int, count: int) -> tuple[ConversationShape, ...]:
    """Independent one-turn requests of exactly `input_tokens` prompt tokens (a random-prompt benchmark):
    the virtual client adds 2 template tokens before and 2 after the turn, so the turn carries the rest."""
    turn = max(1, input_tokens - 4)
    return tuple(ConversationShape(key=i, turn_tokens=(turn,)) for i in range(count))


def _mean_ms(hist: Histogram) -> float | None:
    return 1000.0 * hist.sum_s / hist.count if hist.count else None


def predict(setup: PointSetup, hardware: HardwareProfile) -> Prediction:
    """Run the setup on a fresh engine (no earlier point's cache: every point sends fresh conversations)."""
    engine = Engine(engine_config(setup.profile, run_seed=0, model=setup.model, hardware=hardware))
    run = run_point(engine, list(setup.shapes), concurrency=setup.concurrency, conversations=setup.conversations,
                    max_tokens=setup.max_tokens, start_s=0.0)
    summary = evalscope_like_summary(run)
    h, c = engine.histograms, engine.counters
    acceptance = (1.0 + c.spec_decode_num_accepted_tokens / c.spec_decode_num_drafts
                  if c.spec_decode_num_drafts else None)
    lookups = c.hisparse_cache_hits + c.hisparse_cache_misses
    return Prediction(
        tpot_ms=_mean_ms(h.request_time_per_output_token), prefill_ms=_mean_ms(h.request_prefill_time),
        ttft_ms=_mean_ms(h.time_to_first_token), total_tok_s=summary.total_throughput_tok_s,
        preemptions=c.preemptions, mtp_acceptance_length=acceptance,
        hisparse_hit_rate=c.hisparse_cache_hits / lookups if lookups else None, simulated_s=run.duration_s)
