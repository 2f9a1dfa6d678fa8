#!/usr/bin/env bash
# GPU check of the bundled HiSparse kernels, offline, on one NVIDIA GPU (an H200 for the blog's
# shapes), in one command under 8 minutes:
#
#   benchmarks/gpu_check.sh OUTDIR             build, test, sanitize, graph-check, benchmark
#   benchmarks/gpu_check.sh --dry-run OUTDIR   print the exact steps and budgets; run nothing
#
# It installs nothing and needs no network: the interpreter's own CUDA torch (default
# /opt/torch/.venv/bin/python3, or $HISPARSE_GPU_PYTHON) with numpy, pytest and hypothesis,
# nvcc and g++, compute-sanitizer. A vLLM in that interpreter is detected (never installed) and
# adds the bit-for-bit tests and the plugin probe. The steps, their time limits and the verdict
# are benchmarks/gpu_check.py's (its docstring); OUTDIR/verdict.json holds every figure, and the
# last line printed is the verdict.
#
# Environment (all optional): HISPARSE_GPU_PYTHON (interpreter), HISPARSE_GPU_WORK (build folder,
# default /tmp/hisparse-gpu-check), CUDA_HOME (default /usr/local/cuda), HISPARSE_POOL_GIB (host
# pool of the benchmark, default 32), HISPARSE_BUILD_JOBS (default 8), HISPARSE_BENCH_ARGS.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TARGET=${HISPARSE_GPU_PYTHON:-/opt/torch/.venv/bin/python3}
# The orchestrator is stdlib-only: the target interpreter runs it where it exists, any python3
# otherwise (the dry run on a machine without the GPU image).
if [ -x "$TARGET" ]; then RUNNER=$TARGET; else RUNNER=$(command -v python3 || command -v python); fi
exec "$RUNNER" "$HERE/gpu_check.py" "$@"
