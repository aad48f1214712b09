#!/usr/bin/env bash
# On a machine with several GPUs: one allocator per device, per-device rows (gpu_check multi),
# and UUID matching for every visible device. Results under $OUT.
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
B=.gpu-bundle
exec > >(tee "$OUT/multi_log.txt") 2>&1
nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv,noheader
"$B/gpu_check" multi uuid | tee "$OUT/gpu_check_multi.jsonl"
n=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
for i in $(seq 0 $((n - 1))); do
  CUDA_VISIBLE_DEVICES=$i "$B/gpu_check" uuid | tee -a "$OUT/gpu_check_multi.jsonl"
done
