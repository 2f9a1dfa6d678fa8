"""The padded multi-turn dataset: tokenizer, sources, pads, exact-length builder, cache, verify.

`from harness.dataset import ensure_built, verify_dataset, load_tokenizer` — the names are
resolved lazily so that importing the tokenizer module alone stays light.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "BuiltDataset": "harness.dataset.cache",
    "ensure_built": "harness.dataset.cache",
    "VerifyReport": "harness.dataset.verify",
    "Violation": "harness.dataset.verify",
    "verify_dataset": "harness.dataset.verify",
    "Tokenizer": "harness.dataset.tokenizer",
    "load_tokenizer": "harness.dataset.tokenizer",
    "default_tokenizer_path": "harness.dataset.tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'harness.dataset' has no attribute {name!r}")
