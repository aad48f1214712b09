#!/usr/bin/env bash
# Issue 54 on a GPU machine: notebooks that never call gpumem-nb, and out-of-memory notebooks,
# each run through gpumem-kernel and checked by scripts/gpu/check_notebook.py.
#
# On the GPU machine, after `notebook.sh stash N …` and `notebook.sh setup` (GPU_VALIDATION.md,
# "Notebooks on a GPU"), from the repository root, the machine still warm between calls:
#     bash scripts/gpu/notebook.sh corpus54 warm    the notebooks' `:dep` builds alone, under a time
#                                                  limit; call again until it says done (cargo goes
#                                                  on from what it built; done ones are skipped)
#     bash scripts/gpu/notebook.sh corpus54         every notebook and variant, run and checked
#     bash scripts/gpu/notebook.sh corpus54 gpu_oom_burn corpus    some of them: notebook names
#                                                  (without .ipynb), `corpus` (the gpu_nocall_*) or
#                                                  `oom` (the gpu_oom_*)
# (`bash scripts/gpu/corpus54.sh …` is the same.) The OOM notebooks ask for 96 GiB beside 32 GiB
# kept: they expect a GPU of less than 128 GiB (an 80 GB H100: the device tool's nvidia-h100-x1).
#
# The corpus notebooks (notebooks/gpu_nocall_*.ipynb) run twice: as written (no `:dep gpumem-nb`,
# no call of it), and as the variant NAME-dep: the same file with a first cell `:dep gpumem-nb`
# (still no call), generated here into a temporary directory, never kept as a copy. The OOM
# notebooks (notebooks/gpu_oom_*.ipynb) run once, as written. Each run is `gpumem-kernel run
# --allow-errors` (cells tagged `raises-exception` may fail, every cell runs), its exit status
# kept, then `check_notebook.py --require-tracking cupti --corpus` (`--oom` for the OOM notebooks,
# `--variant dep` for the variant), which prints PASS/FAIL lines and exits 1 on any FAIL or
# MISSING figure.
#
# Results in $OUT/corpus54/: each executed notebook (NAME.ipynb, NAME-dep.ipynb), its HTML page,
# the kernel's log, the check's text and JSON, and summary.txt: one line per notebook and variant
# (code cells, reports, checks passed and failed, the kernel's exit status, seconds). The exit
# status is 1 when any check failed, any run failed or any notebook was not run.
#
# Time (not yet measured on a GPU): `warm` builds six dependency sets: candle, cudarc and burn as
# written, and each again beside gpumem-nb (whose cudarc features, `cupti` among them, make cargo
# build cudarc and what depends on it again). candle's first CUDA build took 2 min 56 s on an
# H100 host (GPU_VALIDATION.md §10), burn on top of it 68 s: expect two or three `warm` calls on
# a fresh machine. After it, each run takes under a minute or so (§21: 19–70 s per notebook once
# built), nine runs in all: about 6–8 minutes. One call must end within the device tool's 10
# minutes: GPUMEM_CORPUS54_BUDGET (seconds, default 560) bounds this script; what it could not
# start in time is listed, and failed: run those by name in a second call.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo" || exit 2
root="${GPUMEM_CORPUS54_ROOT:-/opt/gpumem}"  # what `notebook.sh setup` unpacked (overridable for a dry run)
out="${OUT:-$repo/target/gpu-nb-out}/corpus54"
budget="${GPUMEM_CORPUS54_BUDGET:-560}"
# The longest one notebook's run may take (a cell that hangs on a dead device thread ends here).
per_run="${GPUMEM_CORPUS54_PER_RUN:-360}"
corpus=(gpu_nocall_candle gpu_nocall_cudarc gpu_nocall_burn)
ooms=(gpu_oom_candle gpu_oom_cudarc gpu_oom_burn)

case "${1:-}" in -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;; esac
if [ ! -f "$root/env.sh" ]; then
    echo "corpus54: $root/env.sh is missing: run \`bash scripts/gpu/notebook.sh setup\` first" >&2
    exit 2
fi
# shellcheck disable=SC1091
. "$root/env.sh"
mkdir -p "$out"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/corpus54.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# The variant: the notebook with a first code cell `:dep gpumem-nb` (no call), written to $2.
variant() {
    python3 - "$1" "$2" <<'PY'
import json, sys
nb = json.load(open(sys.argv[1]))
cell = {"cell_type": "code", "execution_count": None, "id": "corpus54-dep-gpumem-nb", "metadata": {},
        "outputs": [], "source": ":dep gpumem-nb"}
nb["cells"].insert(0, cell)
json.dump(nb, open(sys.argv[2], "w"), indent=1)
PY
}

# A notebook's `:dep` cells alone (every cell whose lines are all `:dep` lines), written to $2.
dep_cells() {
    python3 - "$1" "$2" <<'PY'
import json, sys
nb = json.load(open(sys.argv[1]))
def src(c):
    return "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
nb["cells"] = [c for c in nb["cells"] if c["cell_type"] == "code" and src(c).strip()
               and all(l.strip().startswith(":dep") for l in src(c).splitlines() if l.strip())]
json.dump(nb, open(sys.argv[2], "w"), indent=1)
PY
}

left() { echo $((budget - SECONDS)); }

warm() {
    # Each dependency set once: the corpus notebooks as written, then their variants (the OOM
    # notebooks declare the same `:dep` lines as the corpus notebook of their framework).
    local state="$root/corpus54-warm" name label nb file t0 code spent total all=1
    mkdir -p "$state"
    for v in ${GPUMEM_CORPUS54_VARIANTS:-nodep dep}; do
        for name in "${corpus[@]}"; do
            label="$name"; [ "$v" = dep ] && label="$name-dep"
            if [ -e "$state/$label.done" ]; then
                echo "warm $label: done before ($(cat "$state/$label.s" 2>/dev/null || echo '?') s in all)"
                continue
            fi
            if [ "$(left)" -lt 60 ]; then
                echo "warm $label: not started (this call's time is spent)"
                all=0
                continue
            fi
            nb="notebooks/$name.ipynb"
            if [ "$v" = dep ]; then
                variant "$nb" "$tmp/$label.ipynb" && nb="$tmp/$label.ipynb"
            fi
            file="$tmp/warm-$label.ipynb"
            dep_cells "$nb" "$file"
            t0=$SECONDS
            timeout --kill-after=10 "$(( $(left) - 20 ))" gpumem-kernel run "$file" --output "$out/warm-$label.ipynb" \
                > "$out/warm-$label.log" 2>&1
            code=$?
            spent=$((SECONDS - t0))
            total=$(( $(cat "$state/$label.s" 2>/dev/null || echo 0) + spent ))
            echo "$total" > "$state/$label.s"
            if [ "$code" = 0 ]; then
                touch "$state/$label.done"
                echo "warm $label: built in $spent s this call, $total s in all, done"
            else
                all=0
                echo "warm $label: not done (exit $code) after $spent s this call, $total s in all; its log's end:"
                tail -5 "$out/warm-$label.log"
            fi
        done
    done
    if [ "$all" = 1 ]; then
        echo "corpus54 warm: done"
        return 0
    fi
    echo "corpus54 warm: not done: call \`notebook.sh corpus54 warm\` again"
    return 3
}

failed=0
# Runs one notebook file under a label and checks it: run_one FILE LABEL CHECK-ARGS...
run_one() {
    local file="$1" label="$2" t0=$SECONDS code check limit
    shift 2
    limit=$(( $(left) - 20 ))
    if [ "$limit" -lt 30 ]; then
        echo "$label: not run: this call's time is spent (run it by name in another call)" | tee -a "$out/summary.txt"
        failed=1
        return
    fi
    [ "$limit" -gt "$per_run" ] && limit=$per_run
    printf '\n== %s (gpumem-kernel run --allow-errors, at most %s s)\n' "$label" "$limit"
    timeout --kill-after=10 "$limit" gpumem-kernel run "$file" --allow-errors \
        --output "$out/$label.ipynb" --html "$out/$label.html" > "$out/$label.log" 2>&1
    code=$?
    [ "$code" = 124 ] && echo "$label: gpumem-kernel run timed out after $limit s"
    tail -n 12 "$out/$label.log"
    python3 scripts/gpu/check_notebook.py "$out/$label.ipynb" --require-tracking cupti "$@" \
        --json "$out/$label.check.json" --summary "$out/summary.txt" --label "$label" \
        --kernel-exit "$code" --seconds "$((SECONDS - t0))" > "$out/$label.check.txt" 2>&1
    check=$?
    # What failed, then the checks' count (the whole report is in $label.check.txt).
    grep -E '^(FAIL|self-test)' "$out/$label.check.txt" | head -n 40
    grep -E '^PASS \[(nvml-explained|framework-bytes)\]' "$out/$label.check.txt" | head -n 30
    tail -n 1 "$out/$label.check.txt"
    if [ "$code" != 0 ] || [ "$check" != 0 ]; then
        failed=1
        echo "$label: FAILED (gpumem-kernel exit $code, check exit $check)"
    fi
}

run_all() {
    local want=("$@") name v todo=()
    [ "${#want[@]}" = 0 ] && want=(corpus oom)
    for name in "${want[@]}"; do
        case "$name" in
            corpus) todo+=("${corpus[@]}") ;;
            oom) todo+=("${ooms[@]}") ;;
            *) todo+=("$(basename "$name" .ipynb)") ;;
        esac
    done
    : > "$out/summary.txt"
    # As written first (the OOM notebooks share their builds with the corpus notebooks), then the
    # variants.
    for name in "${todo[@]}"; do
        [ -f "notebooks/$name.ipynb" ] || { echo "$name: no notebooks/$name.ipynb" | tee -a "$out/summary.txt"; failed=1; continue; }
        case "$name" in
            gpu_oom_*) run_one "notebooks/$name.ipynb" "$name" --corpus --oom ;;
            *) [[ " ${GPUMEM_CORPUS54_VARIANTS:-nodep dep} " == *" nodep "* ]] && run_one "notebooks/$name.ipynb" "$name" --corpus ;;
        esac
    done
    for name in "${todo[@]}"; do
        case "$name" in
            gpu_oom_*) ;;
            *)
                if [[ " ${GPUMEM_CORPUS54_VARIANTS:-nodep dep} " == *" dep "* ]] && [ -f "notebooks/$name.ipynb" ]; then
                    variant "notebooks/$name.ipynb" "$tmp/$name-dep.ipynb"
                    run_one "$tmp/$name-dep.ipynb" "$name-dep" --corpus --variant dep
                fi
                ;;
        esac
    done
    printf '\n== summary (%s)\n' "$out/summary.txt"
    cat "$out/summary.txt"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/device: /'
    echo "corpus54: $SECONDS s in all"
    return "$failed"
}

case "${1:-run}" in
    warm) warm ;;
    run) shift; run_all "$@" ;;
    *) run_all "$@" ;;
esac
