#!/usr/bin/env bash
# The Slurm recipe against a real Prometheus, two ranks on this host (check.py says what is
# checked): the recipe's prometheus.yml (its file_sd path alone replaced), the example training
# binary on the simulated device, values read back through Prometheus's HTTP API and compared
# with the ranks' own records, every query of the Grafana dashboard answered for both ranks.
# Twice: first the ranks started through rank.sh with the variables srun sets (targets.sh
# writing their targets), then train.sbatch itself submitted to a throwaway one-node Slurm
# (local_slurm.sh; GPUMEM_SLURM_TEST=off leaves this half out). Installs Debian's prometheus,
# slurm-wlm and munge when missing (as root, through apt-get). About a minute.
#   deploy/slurm/test.sh [release|debug] [CARGO-FLAG...]
# CARGO-FLAG: more flags for the example's build (scripts/test.sh passes --all-features in debug:
# the library's tests built the example so, and cargo then has nothing to build).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
profile="${1:-release}"
build_flags=("${@:2}")
target="${CARGO_TARGET_DIR:-$repo/target}"
cd "$repo"
bash -n deploy/slurm/train.sbatch
[ "$profile" = release ] && build_flags=(--release "${build_flags[@]}")
cargo build --quiet -p gpumem-nb --features metrics "${build_flags[@]}" --example train_rank

# shellcheck source=scripts/prometheus_env.sh
. "$repo/scripts/prometheus_env.sh"
need_prometheus
empty="$(mktemp -d)"
promtool check config <(sed "s#/srv/prometheus/gpumem-targets#$empty#" deploy/slurm/prometheus.yml) >/dev/null
rmdir "$empty"
bin="$target/$profile/examples/train_rank"
out="$target/slurm-prometheus-test"
rm -rf "$out"
timeout 300 python3 deploy/slurm/check.py "$bin" "$out/direct"
if [ "${GPUMEM_SLURM_TEST:-on}" = off ]; then
    echo "SKIPPED: train.sbatch through Slurm (GPUMEM_SLURM_TEST=off)"
    exit 0
fi
trap 'deploy/slurm/local_slurm.sh stop "$out/slurm"' EXIT
SLURM_CONF="$(deploy/slurm/local_slurm.sh start "$out/slurm")"
export SLURM_CONF
timeout 300 python3 deploy/slurm/check.py "$bin" "$out/sbatch" --sbatch
