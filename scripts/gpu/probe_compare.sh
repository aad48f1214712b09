#!/usr/bin/env bash
# PyTorch's allocator probe and gpumem-nb's, in the same run on the same GPU, then compared.
#
# Runs on the GPU machine, in the repository root, with in .gpu-bundle/ (built here: there is no
# Rust toolchain there):
#   gpu_probe        cargo build --release --example gpu_probe
#   probe.py         scripts/gpu/probe.py (the PyTorch side of the conformance probe)
#   gpumem-nb-lib-tests-probe (optional, cargo test --lib --release --no-run) the library's tests, of which the gpu_* ones are run
#   (and scripts/gpu/leave_free_torch.py, PyTorch's side of the leave_free case)
# Results under $OUT (default ./gpu-out): torch_results.json, gpumem_results.json,
# compare_log.txt (everything printed). Exits with compare_probe.py's status.
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
B=.gpu-bundle
exec > >(tee "$OUT/compare_log.txt") 2>&1
export PYTHONUNBUFFERED=1

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

echo "== PyTorch's probe (each case in a fresh process)"
T=$(mktemp -d)
start=$(date +%s)
OUT="$T" timeout 420 python3 "$B/probe.py" | grep -v "^$" || echo "probe.py failed: $?"
echo "probe.py took $(( $(date +%s) - start )) s"
cp "$T/results.json" "$OUT/torch_results.json" || { echo "no results.json from probe.py"; exit 2; }

echo "== PyTorch's side of leave_free (not in probe.py: scripts/gpu/leave_free_torch.py, fresh process)"
if PYTHONPATH="$B" timeout 120 python3 scripts/gpu/leave_free_torch.py "$T/leave_free.json" 2048; then
  python3 - "$OUT/torch_results.json" "$T/leave_free.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
r["leave_free"] = json.load(open(sys.argv[2]))
json.dump(r, open(sys.argv[1], "w"), indent=1)
PY
else
  echo "leave_free_torch.py failed: $?"
fi

echo "== gpumem-nb's probe (CUDA backend, each case in a fresh process)"
start=$(date +%s)
GPUMEM_NB_DEVICE=cuda timeout 300 "$B/gpu_probe" --out "$OUT/gpumem_results.json" || echo "gpu_probe failed: $?"
echo "gpu_probe took $(( $(date +%s) - start )) s"

if [ -x "$B/gpumem-nb-lib-tests-probe" ]; then
  echo "== gpumem-nb's GPU library tests (gpu_*)"
  GPUMEM_NB_EXPECT_GPU=1 timeout 120 "$B/gpumem-nb-lib-tests-probe" --include-ignored gpu_ probe_without_driver --test-threads 1 2>&1 | tail -25
fi

echo "== comparison"
python3 scripts/gpu/compare_probe.py "$OUT/torch_results.json" "$OUT/gpumem_results.json"
rc=$?
echo "compare_probe.py exit status $rc"
exit $rc
