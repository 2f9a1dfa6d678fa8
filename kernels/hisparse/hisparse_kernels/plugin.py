"""vLLM general plugin: serve `torch.ops._C_cache_ops.hisparse_*` from the bundled kernels.

vLLM loads `vllm.general_plugins` entry points in every process (API server, engine
core, workers), possibly more than once; `register()` acts once per process:

- vLLM's own kernel libraries are imported first, so that its op definitions (if any)
  exist before the check and cannot land after it;
- where `_C_cache_ops` has all four ops, each schema must equal the bundled one, or the
  plugin logs one line naming the op and both schemas and registers nothing; then the
  bundled kernels are registered for CPU (and CUDA) over vLLM's;
- where `_C_cache_ops` has none of them (vLLM's CPU build), the plugin defines them.

Registration is done in C++ (`attach_cache_ops`): calls go from the dispatcher straight
to the bundled kernels, with no Python on the way.

With HISPARSE_DISPATCH_CHECK=1 (the harness sets it in the servers it starts with bundled
kernels) each process then calls the four ops once through `_C_cache_ops` on tiny CPU
tensors and logs whether the bundled call counters moved: one line per vLLM process, so a
server's own log shows that its engine and workers dispatch to this module. Those calls
stay in the counters (one per op and process).
"""

from __future__ import annotations

import logging
import os
import threading

import hisparse_kernels as hk

# A child of vLLM's logger, so the line shows in vLLM's log with vLLM's format.
logger = logging.getLogger("vllm.hisparse_bundled")
_lock = threading.Lock()
_done = False

_DEFINED, _CPU, _CUDA = 1, 2, 4
DISPATCH_CHECK_ENV = "HISPARSE_DISPATCH_CHECK"


def _import_vllm_kernels() -> None:
    try:
        from vllm.platforms import current_platform

        current_platform.import_kernels()
    except Exception as exc:  # not inside vLLM, or a platform without kernels
        logger.debug("hisparse_bundled: vLLM kernels not imported (%s)", exc)


def schema_of(namespace: str, name: str) -> str | None:
    """The op's schema without its namespace, or None where the op does not exist."""
    import torch

    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        schema = str(packet.default._schema)
    except (AttributeError, RuntimeError):
        return None
    prefix = f"{namespace}::"
    return schema[len(prefix):] if schema.startswith(prefix) else schema


def register() -> None:
    """Entry point of `vllm.general_plugins` (name: hisparse_bundled)."""
    global _done
    with _lock:
        if _done:
            return
        _done = True
    import torch

    _import_vllm_kernels()
    hk.load(announce_line=False)
    theirs = {name: schema_of("_C_cache_ops", name) for name in hk.OP_NAMES}
    present = [name for name, schema in theirs.items() if schema is not None]
    if present and len(present) != len(hk.OP_NAMES):
        missing = sorted(set(hk.OP_NAMES) - set(present))
        logger.error("hisparse_bundled: not registering: _C_cache_ops has %s but lacks %s "
                     "(an op set this module does not implement)", ", ".join(present), ", ".join(missing))
        return
    for name in present:
        ours = schema_of(hk.NAMESPACE, name)
        if theirs[name] != ours:
            logger.error("hisparse_bundled: not registering: _C_cache_ops::%s has schema %s; "
                         "the bundled kernels implement %s", name, theirs[name], ours)
            return
    attached = int(torch.ops.hisparse_kernels.attach_cache_ops(not present))
    keys = "+".join(key for bit, key in ((_CPU, "CPU"), (_CUDA, "CUDA")) if attached & bit)
    how = "defined" if attached & _DEFINED else "over vLLM's kernels"
    hk.announce((hk.NAMESPACE, f"_C_cache_ops ({how}, {keys})"), logger)
    if os.environ.get(DISPATCH_CHECK_ENV) == "1":
        dispatch_check()


def dispatch_check() -> bool:
    """Call each op once via _C_cache_ops (CPU tensors) and log whether the bundled kernels ran."""
    from hisparse_kernels.probe import reach

    found = reach(hk, "cpu")
    missed = [f"{name} ({info['error'] or 'not counted'})" for name, info in found.items() if not info["reached"]]
    if missed:
        logger.error("hisparse_bundled: dispatch check in pid %d FAILED: %s", os.getpid(), "; ".join(missed))
        return False
    logger.info("hisparse_bundled: dispatch check in pid %d: %d/%d ops via _C_cache_ops reached the bundled "
                "cpu kernels", os.getpid(), len(found), len(hk.OP_NAMES))
    return True
