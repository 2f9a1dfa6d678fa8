"""Resolver, CPU kernel vs the numpy oracle, on random batches over several steps.

Each example draws a batch layout (requests, MTP rows per request, block sizes, null and
resident pages, padding requests, a short host pool) and runs three steps that reuse part
of the previous top-k, so hits, misses, evictions and the LRU order all carry over. Every
output, the long-lived state and the stats must be equal, entries left unwritten too.
"""

from __future__ import annotations

import numpy as np
from hs_cases import assert_same, cold_state, make_scenario, op_resolve, oracle_resolve, topk, warm_state
from hypothesis import given, settings
from hypothesis import strategies as st

STEPS = 3
COMMON = settings(max_examples=120, deadline=None, derandomize=True, database=None)


@COMMON
@given(seed=st.integers(0, 2**32 - 1), top_k=st.integers(1, 48),
       rows=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       hot_extra=st.integers(0, 24), hot_block_size=st.sampled_from([1, 4, 8, 16]),
       source_block_size=st.sampled_from([1, 4, 16]), null_fraction=st.sampled_from([0.0, 0.15]),
       resident_fraction=st.sampled_from([0.0, 0.3, 1.0]), pad_first=st.booleans(),
       short_host=st.booleans(), warm=st.booleans(), overlap=st.floats(0.0, 1.0),
       attention_extra=st.integers(0, 5))
def test_resolve_matches_oracle_over_steps(ops, seed, top_k, rows, hot_extra, hot_block_size,
                                           source_block_size, null_fraction, resident_fraction,
                                           pad_first, short_host, warm, overlap, attention_extra):
    rng = np.random.default_rng(seed)
    s = make_scenario(rng, top_k=top_k, rows_per_request=rows, hot_extra=hot_extra,
                      hot_block_size=hot_block_size, source_block_size=source_block_size,
                      null_fraction=null_fraction, resident_fraction=resident_fraction,
                      padding_requests=(0,) if pad_first else (), short_host=short_host,
                      attention_extra=attention_extra)
    state = warm_state(rng, s) if warm else cold_state(s)
    previous = None
    for step in range(STEPS):
        gi = topk(rng, s, previous, overlap=overlap)
        want_state, want = oracle_resolve(s, gi, state)
        got_state, got = op_resolve(ops.hisparse_resolve_residency, s, gi, state)
        assert_same(got_state, got, want_state, want, f"step {step}")
        state, previous = want_state, gi


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**32 - 1), top_k=st.integers(1, 40), rows=st.integers(1, 6),
       short_host=st.booleans(), hot_block_size=st.sampled_from([1, 8]))
def test_resolve_without_tables_matches_oracle(ops, seed, top_k, rows, short_host, hot_block_size):
    """No request ids or source table: positions are host rows, each row its own request."""
    rng = np.random.default_rng(seed)
    s = make_scenario(rng, top_k=top_k, rows_per_request=[1] * rows, with_source=False,
                      short_host=short_host, hot_block_size=hot_block_size, hot_extra=top_k)
    state = warm_state(rng, s)
    previous = None
    for step in range(STEPS):
        gi = topk(rng, s, previous)
        want_state, want = oracle_resolve(s, gi, state)
        got_state, got = op_resolve(ops.hisparse_resolve_residency, s, gi, state)
        assert_same(got_state, got, want_state, want, f"step {step}")
        state, previous = want_state, gi
