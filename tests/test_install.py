"""The package works installed, not only from a checkout: a non-editable install into a fresh
virtual environment, run from a folder outside the checkout, completes a two-point sweep of the
embedded default and `harness calc` (defaults such as the shipped tokenizer and the simulator's
profiles come from the installed package's data)."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _copy_sources(dest: Path) -> Path:
    """What a wheel is built from: pyproject, README and the package (not the checkout's tests or data)."""
    dest.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", dest)
    shutil.copy2(ROOT / "README.md", dest)
    shutil.copytree(ROOT / "harness", dest / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_non_editable_install_runs_a_sweep_and_calc_from_elsewhere(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # the harness's dependencies come from the running environment (a .pth line adds its site folders,
    # whose own .pth files, the editable install's among them, are not run); the package is installed fresh
    new_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    (new_site / "running-env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    src = _copy_sources(tmp_path / "src")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--quiet",
                              "--target", str(new_site), str(src)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([str(python), "-c", "import harness; print(harness.__file__)"], cwd=workdir,
                           capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert where.startswith(str(env_dir)), f"imported {where}, not the installed package"

    sweep = workdir / "sim-2pt.yaml"
    sweep.write_text((ROOT / "sweeps" / "sim.yaml").read_text()
                     .replace("../datasets/", f"{ROOT}/datasets/").replace("../launch/", f"{ROOT}/launch/")
                     .replace("    - {concurrency: 4, conversations: 8}\n", "").replace("    - {concurrency: 8, conversations: 16}\n", ""))
    done = subprocess.run([str(python), "-m", "harness", "sweep", str(sweep), "--launcher", "local",
                           "--run-id", "installed"], cwd=workdir, capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (workdir / "results/installed/summary.csv").read_text().count("\n") == 5  # header + 2 x 2 points
    assert (workdir / "results/installed/report.md").is_file()
    assert (workdir / "plots/installed/pareto.png").is_file()
    assert "report:" in done.stdout.splitlines()[-2] and "figures:" in done.stdout.splitlines()[-1]

    calc = subprocess.run([str(python), "-m", "harness", "calc"], cwd=workdir, capture_output=True, text=True,
                          env=env, timeout=120)
    assert calc.returncode == 0 and "HiSparse" in calc.stdout, calc.stdout + calc.stderr
