#!/usr/bin/env bash
# Every commit subject since BASE is at most 72 characters (issue 56: the why goes in the body).
# The subject is what `git log --format=%s` shows (the message's first paragraph on one line).
# Fails listing each offending commit and its length.
#
# Usage: scripts/check_commits.sh [BASE [TIP]]    (BASE: a4b97d8, the last commit before the rule;
#                                                  TIP: HEAD)
# scripts/test.sh runs it first. To be told at commit time instead, enable the hook in your clone:
#     git config core.hooksPath .githooks
# (.githooks/commit-msg rejects a subject over 72 characters with a one-line reason.)
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-a4b97d8}" tip="${2:-HEAD}" limit=72

if ! git rev-parse --git-dir >/dev/null 2>&1; then
    echo "SKIPPED: not a git checkout, commit subjects not checked"
    exit 0
fi
range="$base..$tip"
if ! git cat-file -e "$base^{commit}" 2>/dev/null; then
    if [ "$(git rev-parse --is-shallow-repository)" = true ]; then
        # A shallow clone without the base holds only commits made after it: check them all.
        echo "check_commits: $base is not in this shallow clone; checking every commit it has"
        range="$tip"
    else
        echo "FAIL: check_commits: base commit $base not found"
        exit 1
    fi
fi

git log --no-show-signature --format='%h%x00%s' "$range" | python3 -c '
import sys
limit = int(sys.argv[1])
bad = []
n = 0
for raw in sys.stdin.buffer.read().decode("utf-8", "replace").splitlines():
    h, _, s = raw.partition("\0")
    n += 1
    if len(s) > limit:
        bad.append(f"  {h} ({len(s)} characters): {s}")
if bad:
    print(f"FAIL: {len(bad)} of {n} commit subjects since {sys.argv[2]} are over {limit} characters:")
    print("\n".join(bad))
    sys.exit(1)
print(f"commit subjects: {n} since {sys.argv[2]}, each at most {limit} characters")
' "$limit" "$base"
