#!/usr/bin/env bash
# GPU check of the bundled HiSparse kernels on a machine with one NVIDIA GPU, unattended:
#   1. a venv with vllm==0.33.0 (its CUDA torch comes with it) and the test tools;
#   2. the module built with CUDA for the local GPU's architecture (needs nvcc);
#   3. the kernel tests with HISPARSE_REQUIRE_GPU=1: CUDA vs the oracle, and bit for bit
#      against vLLM's own ops;
#   4. the plugin probe inside the CUDA vLLM (calls through _C_cache_ops reach bundled code,
#      on CPU and CUDA tensors);
#   5. the benchmark (resolver per step; gathers vs a pinned host-to-device copy).
# Everything it reports lands in OUTDIR (logs, junit XML, probe JSON, results.json/.md,
# summary.txt). Target: under 8 minutes with the venv's wheels at hand.
#
# Usage: benchmarks/gpu_check.sh OUTDIR
# Environment (all optional):
#   HISPARSE_GPU_WORK     work folder: venv, build, overlay (default ~/.cache/hisparse-harness/gpu-check)
#   HISPARSE_WHEELHOUSE   offline install: pip --no-index --find-links DIR (make it where there is
#                         network with: pip download -d DIR vllm==0.33.0 numpy pytest pytest-timeout
#                         hypothesis ninja setuptools). A venv that already has vllm 0.33.0 is reused
#                         without touching the network at all.
#   PYTHON                interpreter for the venv (default python3)
#   HISPARSE_BENCH_ARGS   benchmark arguments (default --quick)
set -euo pipefail

OUT=${1:?usage: benchmarks/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${HISPARSE_GPU_WORK:-$HOME/.cache/hisparse-harness/gpu-check}
VENV=$WORK/venv
VPY=$VENV/bin/python
OVERLAY=$WORK/overlay
STARTED=$(date +%s)
STEP="start"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

say() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$SUMMARY"; }
die() { say "FAILED at step '$STEP': $*"; trap - EXIT; exit 1; }
on_exit() { local rc=$?; [ "$rc" -eq 0 ] || say "FAILED at step '$STEP' (exit $rc); logs in $OUT"; }
trap on_exit EXIT
step() { STEP=$1; say "step: $1 ($(( $(date +%s) - STARTED ))s elapsed)"; }

step "preflight"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs an NVIDIA GPU and driver"
nvidia-smi -L >"$OUT/gpu.txt" 2>&1 || die "nvidia-smi -L failed: $(tail -1 "$OUT/gpu.txt")"
grep -q "GPU" "$OUT/gpu.txt" || die "nvidia-smi lists no GPU"
NVCC=""
for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" "$(command -v nvcc || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then NVCC=$candidate; break; fi
done
[ -n "$NVCC" ] || die "no nvcc (looked in \$CUDA_HOME/bin, /usr/local/cuda/bin, PATH): install the CUDA toolkit"
export CUDA_HOME
CUDA_HOME=$(cd "$(dirname "$NVCC")/.." && pwd)
"$NVCC" --version | tail -2 | tee -a "$SUMMARY"
say "GPU: $(head -1 "$OUT/gpu.txt")"

step "venv with vllm==0.33.0"
mkdir -p "$WORK"
if ! "$VPY" -c "import vllm, sys; sys.exit(vllm.__version__ != '0.33.0')" >/dev/null 2>&1; then
  [ -x "$VPY" ] || "${PYTHON:-python3}" -m venv "$VENV" || die "cannot create a venv with ${PYTHON:-python3}"
  PIP_ARGS=(--disable-pip-version-check --no-input)
  if [ -n "${HISPARSE_WHEELHOUSE:-}" ]; then PIP_ARGS+=(--no-index --find-links "$HISPARSE_WHEELHOUSE"); fi
  "$VPY" -m pip install "${PIP_ARGS[@]}" vllm==0.33.0 numpy pytest pytest-timeout hypothesis ninja setuptools \
    >"$OUT/pip.log" 2>&1 || die "pip could not install vllm==0.33.0 ($(tail -1 "$OUT/pip.log")); offline? set HISPARSE_WHEELHOUSE (see the header of this script)"
fi
"$VPY" - <<'EOF' | tee "$OUT/versions.txt" | tee -a "$SUMMARY"
import torch, vllm
print(f"vllm {vllm.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"GPU {torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
EOF
ARCH=$("$VPY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())") || die "torch sees no CUDA GPU"

step "build the module (CUDA, arch $ARCH)"
rm -rf "$WORK/src" "$OVERLAY"
"$VPY" -c "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2], ignore=shutil.ignore_patterns('build', '*.egg-info', '__pycache__', '*.so', '*.o', 'tests'))" \
  "$ROOT/kernels/hisparse" "$WORK/src"
HISPARSE_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST=$ARCH MAX_JOBS=${MAX_JOBS:-16} \
  timeout 600 "$VPY" -m pip install --no-build-isolation --no-deps --no-input --target "$OVERLAY" "$WORK/src" \
  >"$OUT/build.log" 2>&1 || die "the CUDA build failed: $(grep -m1 -i 'error' "$OUT/build.log" || tail -1 "$OUT/build.log")"
PYTHONPATH=$OVERLAY "$VPY" -c "import json, hisparse_kernels as hk; print(json.dumps(hk.identity().__dict__))" \
  | tee "$OUT/identity.json" | tee -a "$SUMMARY"
grep -q '"built_for": "cuda"' "$OUT/identity.json" || die "the build is not a CUDA build"

step "kernel tests (HISPARSE_REQUIRE_GPU=1)"
cd "$ROOT"
set +e
HISPARSE_REQUIRE_GPU=1 PYTHONPATH=$OVERLAY timeout 300 "$VPY" -m pytest -q -rs -p no:cacheprovider \
  --junitxml "$OUT/kernel_tests.xml" kernels/hisparse/tests >"$OUT/kernel_tests.log" 2>&1
TESTS_RC=$?
set -e
say "kernel tests: $(tail -1 "$OUT/kernel_tests.log")"

step "plugin probe in vLLM 0.33.0"
PYTHONPATH=$OVERLAY timeout 300 "$VPY" -m hisparse_kernels.probe >"$OUT/probe.log" 2>&1 || true
grep '^HISPARSE_PROBE ' "$OUT/probe.log" | sed 's/^HISPARSE_PROBE //' >"$OUT/probe.json" || true
"$VPY" - "$OUT/probe.json" <<'EOF' | tee -a "$SUMMARY" || PROBE_BAD=1
import json, sys
raw = json.load(open(sys.argv[1]))
cpu = all(v["reached"] for v in raw["ops"].values()) and len(raw["ops"]) == 4
cuda = all(v["reached"] for v in raw.get("ops_cuda", {}).values()) and len(raw.get("ops_cuda", {})) == 4
print(f"probe: vLLM {raw['vllm_version']}, CPU calls reached bundled: {cpu}, CUDA calls: {cuda}, error: {raw['error']}")
sys.exit(0 if cpu and cuda and not raw["error"] else 1)
EOF
grep -m1 "registered: hisparse_kernels" "$OUT/probe.log" | tee -a "$SUMMARY" || say "no identity line in the probe log"

step "benchmark"
# VLLM_PLUGINS names no plugin: vLLM's own ops stay vLLM's for the side-by-side.
read -r -a BENCH_ARGS <<<"${HISPARSE_BENCH_ARGS:---quick}"
VLLM_PLUGINS="" PYTHONPATH=$OVERLAY timeout 420 "$VPY" benchmarks/hisparse_kernels.py --out "$OUT" \
  "${BENCH_ARGS[@]}" >"$OUT/benchmark.log" 2>&1 || die "the benchmark failed: $(tail -1 "$OUT/benchmark.log")"

STEP="verdict"
say "total $(( $(date +%s) - STARTED ))s"
[ "$TESTS_RC" -eq 0 ] || die "kernel tests failed (exit $TESTS_RC): see $OUT/kernel_tests.log"
[ -z "${PROBE_BAD:-}" ] || die "the plugin probe did not prove dispatch: see $OUT/probe.log"
say "OK"
