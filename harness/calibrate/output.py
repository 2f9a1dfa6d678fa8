"""The calibrated profile on disk: a complete hardware profile (the simulator loads it by path) whose
`sources` say where every coefficient came from and whose `calibration` holds the fit's provenance."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.io import atomic_write_text
from harness.sim.profiles import HardwareProfile

HEADER = ("# A calibrated simulator profile, written by `harness calibrate` (docs/calibration.md).\n"
          "# Use it as a launch profile's sim.hardware_profile (a path), or let `calibrate --validate` do so.\n"
          "# `sources` names where each coefficient came from; `calibration` is the fit: its input, method,\n"
          "# and the error at every point it used (and, after --validate, at every point of the sweep).\n")


def render_profile(profile: HardwareProfile) -> str:
    data = profile.model_dump(mode="json", exclude_none=True)
    return HEADER + yaml.safe_dump(data, sort_keys=False, width=110, allow_unicode=True)


def write_profile(profile: HardwareProfile, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_profile(profile))
    return path
