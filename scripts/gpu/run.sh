#!/usr/bin/env bash
# Runs on the GPU machine, in the repository root, with the bundle from scripts/gpu-check.sh in
# .gpu-bundle/. Writes results under $OUT (default ./gpu-out).
#
#     bash scripts/gpu/run.sh [PART...]      PART: bench history snapshots checks tests track hooks fit
#                                           (default: all of them, in that order)
set -uo pipefail
PARTS="${*:-bench history snapshots checks tests track hooks fit}"
want() { [[ " $PARTS " == *" $1 "* ]]; }
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
B="${GPUMEM_BUNDLE:-.gpu-bundle}"
exec > >(tee "$OUT/log.txt") 2>&1

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)"
date -u +%Y-%m-%dT%H:%MZ
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
echo "parts: $PARTS"
CUDA_HOME="${CUDA_HOME:-$(ls -d /usr/local/cuda* 2>/dev/null | head -1)}"

if want bench; then
echo "== allocator benchmarks, three runs: PyTorch's C++ allocator and the CUDA driver, gpumem-nb timed the"
echo "   same way (examples/alloc_pairs.rs), gpumem-nb's criterion benchmark; medians by scripts/gpu/bench_median.py"
TORCH=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
g++ -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 scripts/gpu/alloc_bench.cpp \
    -I"$TORCH/include" -I"$CUDA_HOME/include" \
    -L"$TORCH/lib" -lc10 -lc10_cuda -L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib64/stubs" -lcudart -lcuda \
    -Wl,-rpath,"$TORCH/lib" -o /tmp/alloc_bench
for run in 1 2 3; do
  echo "-- run $run"
  LD_LIBRARY_PATH="$TORCH/lib:${LD_LIBRARY_PATH:-}" /tmp/alloc_bench 200000 7 | tee "$OUT/torch_driver_bench_run$run.jsonl"
  "$B/alloc_pairs" 200000 7 | tee "$OUT/gpumem_pairs_run$run.jsonl"
  "$B/alloc-bench" --bench --warm-up-time 1 --measurement-time 3 2>&1 | grep -E "^(hot|mixed)|time:" | grep -v "%" | tee "$OUT/gpumem_bench_run$run.txt"
done
# The mixed pair interleaved: in each of three runs, seven alternations of one PyTorch repeat
# (its own process) and one gpumem-nb repeat (its own process), so a drift of the host's speed
# within a run touches both sides alike; each alternation's ratio is kept (bench_median.py).
for run in 1 2 3; do
  for k in 1 2 3 4 5 6 7; do
    LD_LIBRARY_PATH="$TORCH/lib:${LD_LIBRARY_PATH:-}" /tmp/alloc_bench 200000 1 mixed >> "$OUT/mixed_interleaved_torch_run$run.jsonl"
    "$B/alloc_pairs" 200000 1 mixed >> "$OUT/mixed_interleaved_gpumem_run$run.jsonl"
  done
done
python3 scripts/gpu/bench_median.py "$OUT" | tee "$OUT/bench_median.txt"
fi

if want history && [ -x "$B/history-bench" ]; then
  echo "== history recording and snapshot benchmarks (simulated device, CPU only)"
  "$B/history-bench" --bench --warm-up-time 1 --measurement-time 3 2>&1 | grep -E "^(pair|snapshot)|time:" | grep -v "%" | tee "$OUT/history_bench.txt"
fi

if want snapshots && [ -x "$B/snapshot_demo" ]; then
  echo "== a snapshot written on this GPU (CUDA backend), and PyTorch's tools on every snapshot"
  "$B/snapshot_demo" "$B/snapshots/cuda" || echo "snapshot_demo failed: $?"
  for snap in "$B"/snapshots/*/snapshot.pickle; do
    for cmd in stats trace; do
      python3 -m torch.cuda._memory_viz "$cmd" "$snap" > /tmp/viz.out 2>&1
      rc=$?
      echo "_memory_viz $cmd $snap: exit $rc, $(wc -l < /tmp/viz.out) lines"
      head -12 /tmp/viz.out
    done
  done
  cp "$B/snapshots/cuda/snapshot.pickle" "$OUT/cuda_snapshot.pickle" 2>/dev/null
  echo "== _memory_viz segments and memory (flame graphs) on the GPU snapshot and the replay, numbers checked"
  for d in "$B/snapshots/cuda" "$B/snapshots/gpt2"; do
    echo "-- $d"
    python3 scripts/gpu/memviz_check.py "$d" "$B/inferno-flamegraph" || echo "memviz_check failed on $d: $?"
  done
  cp "$B/snapshots/cuda/segments.svg" "$B/snapshots/cuda/memory.svg" "$OUT/" 2>/dev/null
fi

if want checks && [ -x "$B/gpu_check" ]; then
  echo "== GPU-only checks: CUDA pool numbers, NVML vs cuMemGetInfo, UUID matching, devices"
  "$B/gpu_check" | tee "$OUT/gpu_check.jsonl"
  CUDA_VISIBLE_DEVICES=0 "$B/gpu_check" uuid | tee -a "$OUT/gpu_check.jsonl"
  uuid0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
  CUDA_VISIBLE_DEVICES="$uuid0" "$B/gpu_check" uuid | tee -a "$OUT/gpu_check.jsonl"
fi

# A test binary's whole output goes to $OUT/NAME.txt and its last lines here; a failing one
# is named on the last line and makes the exit status 1.
failed=()
tests_step() {
  local name="$1"
  shift
  if GPUMEM_NB_EXPECT_GPU=1 LD_LIBRARY_PATH="$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}" "$@" > "$OUT/$name.txt" 2>&1; then
    tail -4 "$OUT/$name.txt"
  else
    tail -40 "$OUT/$name.txt"
    failed+=("$name")
  fi
}
if want tests && [ -x "$B/gpumem-nb-lib-tests" ]; then
  # The library's GPU tests (gpu_*) are #[ignore]d on a CPU host; here they run, and fail
  # naming why when the GPU is not usable.
  echo "== gpumem-nb library tests on the GPU (CUDA backend, buffers, cudarc interop, compact:True), GPU tests included"
  tests_step lib-tests "$B/gpumem-nb-lib-tests" --include-ignored --test-threads 1
fi
if want tests; then
  for t in mem pinned; do
    [ -x "$B/gpumem-nb-test-$t" ] || continue
    echo "== tests/$t.rs on the GPU, its GPU tests included (--include-ignored)"
    tests_step "test-$t" "$B/gpumem-nb-test-$t" --include-ignored --test-threads 1
  done
fi

if want track && [ -x "$B/track_check" ]; then
  echo "== every device allocation of the process tracked (CUPTI): cudarc, cuMemAlloc, cuBLAS, VMM, pinned host; its cost"
  GPUMEM_NB_EXPECT_GPU=1 GPUMEM_NB_DEVICE=cuda LD_LIBRARY_PATH="$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}" \
    "$B/track_check" > "$OUT/track_check.jsonl"
  echo "track_check exit status $?"
  cat "$OUT/track_check.jsonl"
fi

if want hooks && [ -x "$B/hook_path" ]; then
  echo "== the per-cell hook path: the kernel's hooks measuring a compiled notebook child (kernel/tests/hook_path.rs)"
  GPUMEM_NB_EXPECT_GPU=1 timeout 300 "$B/hook_path" > "$OUT/hook_path.jsonl" 2> "$OUT/hook_path.stderr"
  echo "hook_path exit status $?"
  grep -v '"check"' "$OUT/hook_path.jsonl" | python3 -c '
import json, sys
for l in sys.stdin:
    l = l.rstrip("\n")
    try:
        v = json.loads(l)
    except ValueError:
        print(l)  # the history table
        continue
    if "line" in v:
        print(v["line"])
    elif "summary" in v:
        print("summary:", json.dumps(v["summary"]))'
  grep '"pass":false' "$OUT/hook_path.jsonl" | head -20
  if [ -x "$B/kernel-overhead" ]; then
    echo "== per-cell hook overhead (kernel/tests/overhead.rs)"
    "$B/kernel-overhead" --ignored --nocapture hook_overhead 2>&1 | grep '^{' | tee "$OUT/hook_overhead.json"
  fi
fi

if want fit && [ -x "$B/gpumem-replay" ]; then
  echo "== PyTorch snapshots recorded here (scripts/gpu/record_snapshots.py), replayed by gpumem-replay to PyTorch's peaks,"
  echo "   and --fit at PyTorch's reserved peak and 256 MiB under its allocated peak (default and compact)"
  python3 scripts/gpu/record_snapshots.py "$OUT/snapshots" --scale small --replay "$B/gpumem-replay"
  echo "record_snapshots small exit status $?"
  python3 scripts/gpu/record_snapshots.py "$OUT/snapshots-full" --scale full --only convnet_varbatch --replay "$B/gpumem-replay"
  echo "record_snapshots full exit status $?"
  find "$OUT/snapshots-full" -name '*.pickle' -size +50M -delete  # too large to bring back; the JSON keeps PyTorch's numbers
fi

if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED on the GPU: ${failed[*]} (whole output in \$OUT/NAME.txt)"
  exit 1
fi
