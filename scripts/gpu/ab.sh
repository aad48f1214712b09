#!/usr/bin/env bash
# The allocator front, A/B on the GPU host: PyTorch's C++ caching allocator, gpumem-nb as it is
# and gpumem-nb before a change, timed the same way (scripts/gpu/alloc_bench.cpp and
# examples/alloc_pairs.rs: same sizes, seed, pairs and repeats), interleaved in one run, three
# runs; then the mixed workload alternated process by process as `run.sh bench` does.
#     bash scripts/gpu/ab.sh NEW_ALLOC_PAIRS PREV_ALLOC_PAIRS      (results under $OUT)
# Writes torch_driver_bench_runN.jsonl and gpumem_pairs_runN.jsonl (bench_median.py reads them)
# and gpumem_prev_runN.jsonl, then prints the medians and ratios (ab_median.txt).
set -uo pipefail
NEW="$1"
PREV="$2"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
CUDA_HOME="${CUDA_HOME:-$(ls -d /usr/local/cuda* 2>/dev/null | head -1)}"
TORCH=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name"
g++ -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 scripts/gpu/alloc_bench.cpp \
    -I"$TORCH/include" -I"$CUDA_HOME/include" \
    -L"$TORCH/lib" -lc10 -lc10_cuda -L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib64/stubs" -lcudart -lcuda \
    -Wl,-rpath,"$TORCH/lib" -o /tmp/alloc_bench
torch() { LD_LIBRARY_PATH="$TORCH/lib:${LD_LIBRARY_PATH:-}" /tmp/alloc_bench "$@"; }
for run in 1 2 3; do
  echo "-- run $run"
  # Each run in a different order, so that no side always goes first.
  case $run in
    1) order="torch new prev" ;; 2) order="new prev torch" ;; 3) order="prev torch new" ;;
  esac
  for side in $order; do
    case $side in
      torch) torch 200000 7 > "$OUT/torch_driver_bench_run$run.jsonl" ;;
      new) "$NEW" 200000 7 > "$OUT/gpumem_pairs_run$run.jsonl" ;;
      prev) "$PREV" 200000 7 | sed 's/"gpumem_nb/"prev_gpumem_nb/' > "$OUT/gpumem_prev_run$run.jsonl" ;;
    esac
  done
  cat "$OUT/torch_driver_bench_run$run.jsonl" "$OUT/gpumem_pairs_run$run.jsonl" "$OUT/gpumem_prev_run$run.jsonl"
  for k in 1 2 3 4 5 6 7; do
    torch 200000 1 mixed >> "$OUT/mixed_interleaved_torch_run$run.jsonl"
    "$NEW" 200000 1 mixed >> "$OUT/mixed_interleaved_gpumem_run$run.jsonl"
    "$PREV" 200000 1 mixed | sed 's/"gpumem_nb/"prev_gpumem_nb/' >> "$OUT/mixed_interleaved_prev_run$run.jsonl"
  done
done
python3 scripts/gpu/bench_median.py "$OUT" > "$OUT/bench_median.txt" 2>&1
python3 - "$OUT" <<'PY' | tee "$OUT/ab_median.txt"
import json, glob, os, statistics, sys
out = sys.argv[1]
def rows(pattern):
    d = {}
    for p in sorted(glob.glob(os.path.join(out, pattern))):
        for l in open(p):
            if l.startswith("{"):
                x = json.loads(l)
                d.setdefault((x["impl"], x["workload"]), []).append(x["ns_per_pair"])
    return d
t, n, p = rows("torch_driver_bench_run*.jsonl"), rows("gpumem_pairs_run*.jsonl"), rows("gpumem_prev_run*.jsonl")
mt, mn, mp = rows("mixed_interleaved_torch_run*.jsonl"), rows("mixed_interleaved_gpumem_run*.jsonl"), rows("mixed_interleaved_prev_run*.jsonl")
med = statistics.median
print("ns per alloc+free pair, median of 3 runs (each run: median of 7 repeats of 200,000 pairs)")
print(f"{'workload':24s} {'PyTorch':>8s} {'now':>8s} {'before':>8s} {'PyTorch/now':>12s} {'PyTorch/before':>15s} {'before/now':>11s}")
for w in ["hot/512", "hot/1048576", "hot/67108864", "mixed_1000_live"]:
    a, b, c = med(t[("pytorch_c10", w)]), med(n[("gpumem_nb", w)]), med(p[("prev_gpumem_nb", w)])
    print(f"{w:24s} {a:8.1f} {b:8.1f} {c:8.1f} {a / b:12.2f} {a / c:15.2f} {c / b:11.2f}")
for (impl, w), v in sorted(n.items()):
    if impl != "gpumem_nb":
        print(f"{impl + ' ' + w:40s} now {med(v):8.1f}" + (f"   before {med(p[('prev_' + impl, w)]):8.1f}" if ('prev_' + impl, w) in p else ""))
a, b, c = mt[("pytorch_c10", "mixed_1000_live")], mn[("gpumem_nb", "mixed_1000_live")], mp[("prev_gpumem_nb", "mixed_1000_live")]
ratios = [x / y for x, y in zip(a, b)]
print(f"mixed, alternated process by process (21 alternations): PyTorch {med(a):.1f}, now {med(b):.1f}, before {med(c):.1f} ns; "
      f"PyTorch/now per alternation median {med(ratios):.2f} (min {min(ratios):.2f}); before/now {med(c) / med(b):.2f}")
PY
