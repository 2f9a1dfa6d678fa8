"""Proof that `torch.ops._C_cache_ops.hisparse_*` reach the bundled kernels in a vLLM environment.

Run as `python -m hisparse_kernels.probe` with the module's overlay on PYTHONPATH. It
loads vLLM's plugins the way a vLLM worker does, calls each of the four ops once through
`_C_cache_ops` on tiny CPU tensors, and compares the bundled call counters before and
after. Prints one line: PREFIX followed by a JSON object (see `main`).
"""

from __future__ import annotations

import json
import logging
import sys

PREFIX = "HISPARSE_PROBE "


def _calls(device: str = "cpu"):
    import torch

    ops = torch.ops._C_cache_ops
    i32, u8 = torch.int32, torch.uint8
    cuda = device == "cuda"

    def host(*shape):  # the host pool: CPU memory, pinned for the CUDA kernels
        t = torch.ones(*shape, dtype=u8)
        return t.pin_memory() if cuda else t

    def on(t):
        return t.to(device)

    def resolve():
        ops.hisparse_resolve_residency(
            host(8, 16), on(torch.zeros(1, 4, 16, dtype=u8)), on(torch.zeros(1, 1, dtype=i32)),
            on(torch.tensor([[1, 2]], dtype=i32)), on(torch.empty(1, 2, dtype=i32)),
            on(torch.full((1, 4), -1, dtype=i32)), on(torch.arange(4, dtype=torch.int16).view(1, 4)), None, 4, 2)

    def invalidate():
        ops.hisparse_invalidate_written_slots(on(torch.zeros(1, 4, dtype=i32)), on(torch.zeros(1, dtype=i32)),
                                              on(torch.zeros(1, dtype=i32)), on(torch.zeros(1, dtype=torch.int64)))

    def plan():
        ops.hisparse_gather_plan(host(8, 16), on(torch.zeros(4, 16, dtype=u8)), on(torch.tensor([[1]], dtype=i32)),
                                 on(torch.tensor([[0]], dtype=i32)), on(torch.tensor([[1]], dtype=i32)), None)

    def compact():
        ops.hisparse_gather_compact(host(8, 16), on(torch.zeros(1, 4, 16, dtype=u8)),
                                    on(torch.tensor([[1]], dtype=i32)), on(torch.tensor([[0]], dtype=i32)),
                                    on(torch.tensor([1], dtype=i32)))

    return {"hisparse_resolve_residency": resolve, "hisparse_invalidate_written_slots": invalidate,
            "hisparse_gather_plan": plan, "hisparse_gather_compact": compact}


def reach(hk, device: str) -> dict:
    """Call each op once through _C_cache_ops on `device`; did the bundled counter move?"""
    out = {}
    for name, call in _calls(device).items():
        before = hk.call_counts()["_C_cache_ops"][device][name]
        error = None
        try:
            call()
            if device == "cuda":
                import torch

                torch.cuda.synchronize()  # a kernel fault shows here, not later
        except Exception as exc:  # an op vLLM lacks, or one that is not ours
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        after = hk.call_counts()["_C_cache_ops"][device][name]
        out[name] = {"reached": error is None and after == before + 1, "error": error}
    return out


def _configure_logging_like_vllm() -> None:
    """vLLM processes configure its logger before plugins load; a bare import does not."""
    try:
        from vllm.config.logging import LoggingConfig
        from vllm.logger import configure_logging

        configure_logging(LoggingConfig())
    except Exception:  # another vLLM layout: fall back to a plain handler below
        pass
    vllm_logger = logging.getLogger("vllm")
    if not vllm_logger.handlers:
        vllm_logger.addHandler(logging.StreamHandler(sys.stderr))
        vllm_logger.setLevel(logging.INFO)


def probe() -> dict:
    """{"vllm_version", "identity", "ops": {name: {"reached", "error"}}, "error"}; CUDA builds on a
    GPU also report "ops_cuda" (the same calls on CUDA tensors)."""
    result: dict = {"vllm_version": None, "identity": None, "ops": {}, "error": None}
    try:
        import vllm
        from vllm.plugins import load_general_plugins

        result["vllm_version"] = getattr(vllm, "__version__", None)
        _configure_logging_like_vllm()
        load_general_plugins()  # what every vLLM process does at start
        import hisparse_kernels as hk

        ident = hk.identity()
        result["identity"] = {"version": ident.version, "source_sha256": ident.source_sha256,
                              "built_for": ident.built_for, "cuda_arch": ident.cuda_arch}
        result["ops"] = reach(hk, "cpu")
        import torch

        if ident.built_for == "cuda" and torch.cuda.is_available():
            result["ops_cuda"] = reach(hk, "cuda")
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


def main() -> None:
    print(PREFIX + json.dumps(probe()), flush=True)


if __name__ == "__main__":
    main()
