"""vllm_hisparse_ops.h (the C++ declarations the drop-in is compiled against) says what vLLM's
schemas say: each function's parameters, in order, with the C++ type torch's stable ABI binds to
each schema type. The compile check then holds the drop-in to this header (see the header)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from vllm_schemas import VLLM_SCHEMAS

HEADER = Path(__file__).resolve().parents[1] / "csrc" / "vllm_dropin" / "vllm_hisparse_ops.h"
DROPIN = HEADER.parent / "hisparse_kernels.cu"
TENSOR = "torch::stable::Tensor"
CPP_OF = {"Tensor": f"{TENSOR} const&", "Tensor!": f"{TENSOR}&", "Tensor?": f"std::optional<{TENSOR}> const&",
          "int": "int64_t"}


def schema_params(schema: str) -> list[tuple[str, str]]:
    inside = schema[schema.index("(") + 1: schema.rindex(") ->")]
    out = []
    for arg in inside.split(", "):
        kind, name = arg.split("=")[0].rsplit(" ", 1)
        kind = re.sub(r"\([a-z]!\)", "", kind)  # Tensor(a!)? is a Tensor? the op writes
        out.append((CPP_OF[kind], name))
    return out


def declarations(text: str) -> dict[str, list[tuple[str, str]]]:
    text = re.sub(r"//.*", "", text)
    out = {}
    for name, params in re.findall(r"void\s+(\w+)\s*\(([^;{]*?)\)\s*[;{]", text, flags=re.S):
        parts = [" ".join(p.split()) for p in params.split(",")]
        out[name] = [tuple(p.rsplit(" ", 1)) for p in parts]
    return out


@pytest.mark.parametrize("name", sorted(VLLM_SCHEMAS))
def test_header_declares_vllms_signature(name):
    declared = declarations(HEADER.read_text())
    assert declared[name] == schema_params(VLLM_SCHEMAS[name])


@pytest.mark.parametrize("name", sorted(VLLM_SCHEMAS))
def test_dropin_defines_the_same_signature(name):
    """The drop-in's definitions, parsed the same way (the compile check proves it in C++)."""
    defined = declarations(DROPIN.read_text().replace("OptTensor", f"std::optional<{TENSOR}>"))
    assert defined[name] == schema_params(VLLM_SCHEMAS[name])


def test_the_dropin_checks_every_signature():
    text = DROPIN.read_text()
    for name in VLLM_SCHEMAS:
        assert f"decltype(&::{name})" in text, name
