"""Fixtures of the kernel tests: the bundled ops, loaded once (CPU build is enough)."""

from __future__ import annotations

import hisparse_kernels as hk
import pytest
import torch


@pytest.fixture(scope="session")
def ops():
    hk.load()
    return torch.ops.hisparse_kernels
