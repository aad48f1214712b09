#!/usr/bin/env bash
# vendor/evcxr as a patch series: the evcxr crate as published on crates.io, less the files
# cargo adds when it packages a crate, then every vendor/evcxr/patches/*.patch in the order of
# their names (vendor/evcxr/PATCHES.md says what each does, how to add one and how to move to a
# later evcxr).
#
# Usage: scripts/evcxr_patches.sh rebuild [VERSION]
#            vendor/evcxr (all of it but patches/) made anew from the series
#        scripts/evcxr_patches.sh check [VERSION]
#            the series made in a temporary directory and compared with vendor/evcxr: exit 1
#            with the difference when they differ (scripts/test.sh runs it)
#        scripts/evcxr_patches.sh new NAME
#            vendor/evcxr's difference from the series written as the next patch,
#            vendor/evcxr/patches/NN-NAME.patch, with a header to fill in
#        scripts/evcxr_patches.sh unpack VERSION DIR
#            DIR made a git repository of the published crate with one commit per patch that
#            applies, stopping at the first that does not (to carry the patches to VERSION)
#
# VERSION is 0.22.0 unless given. The crate comes from cargo's registry cache
# (~/.cargo/registry/cache/*/evcxr-VERSION.crate) when it is there, else from static.crates.io
# (curl); a version whose checksum is known here is checked. Each patch is checked before it is
# applied (GNU patch --dry-run without fuzz, or `git apply --check` where patch is missing), and a
# patch that does not apply stops the run, named. Everything is made in a temporary directory:
# vendor/evcxr is replaced only when every patch applied. Needs bash, curl, tar, diff, git and
# patch (optional).
set -euo pipefail
export LC_ALL=C

EVCXR_VERSION=0.22.0
# The published crates' SHA-256, as crates.io's index gives it ("cksum").
declare -A CRATE_SHA256=(
    [0.22.0]=ee69caeeefc311959b85962458e370d8eccb165123edbc5270134aaee6d7ed80
)
# What cargo adds to a package, dropped from vendor/evcxr.
DROPPED=(.cargo_vcs_info.json .cargo-ok Cargo.lock Cargo.toml.orig)

repo="$(cd "$(dirname "$0")/.." && pwd)"
vendor="$repo/vendor/evcxr"
patches="$vendor/patches"

die() {
    echo "evcxr_patches: $*" >&2
    exit 1
}
usage() {
    sed -n '7,17s/^# \{0,1\}//p' "$0" >&2
    exit 2
}

work=$(mktemp -d "${TMPDIR:-/tmp}/evcxr-patches.XXXXXX")
trap 'rm -rf "$work"' EXIT


sha256() {
    if command -v sha256sum >/dev/null; then sha256sum "$1"; else shasum -a 256 "$1"; fi | cut -d' ' -f1
}

# published VERSION DIR: the published crate, less DROPPED, in DIR (which must not exist).
published() {
    local version=$1 dir=$2 crate="" c
    for c in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"evcxr-$version.crate"; do
        [ -f "$c" ] && crate=$c && break
    done
    if [ -z "$crate" ]; then
        crate="$work/evcxr-$version.crate"
        curl -sSfL --retry 3 -o "$crate" "https://static.crates.io/crates/evcxr/evcxr-$version.crate" ||
            die "could not download evcxr $version from static.crates.io"
    fi
    local want=${CRATE_SHA256[$version]:-} got
    got=$(sha256 "$crate")
    [ -z "$want" ] || [ "$got" = "$want" ] || die "$crate: SHA-256 $got, crates.io's evcxr $version is $want"
    local unpacked
    unpacked=$(mktemp -d "$work/crate.XXXXXX")
    # Extracted files dated now (-m): cargo sees a file that changed as newer than its last build.
    tar -xzmf "$crate" -C "$unpacked" --no-same-owner
    [ -d "$unpacked/evcxr-$version" ] || die "$crate holds no evcxr-$version/"
    mv "$unpacked/evcxr-$version" "$dir"
    (cd "$dir" && rm -f "${DROPPED[@]}")
}

# apply_patch DIR PATCH: PATCH applied in DIR once a dry run showed that all of it applies.
apply_patch() {
    local dir=$1 p=$2 out
    if command -v patch >/dev/null && [ "${EVCXR_PATCHES_WITH:-patch}" = patch ]; then
        local opts=(-d "$dir" -p1 --batch --forward --fuzz=0 --no-backup-if-mismatch -r -)
        out=$(patch "${opts[@]}" --dry-run <"$p" 2>&1) || { echo "$out" >&2; return 1; }
        patch "${opts[@]}" -s <"$p"
    else
        # No repository above DIR is looked for: the patch's paths are DIR's.
        (cd "$dir" && export GIT_CEILING_DIRECTORIES="$(dirname "$dir")" &&
            git apply --check "$p" && git apply "$p")
    fi
}

# build VERSION DIR: the published crate and every patch, in DIR.
build() {
    local version=$1 dir=$2 p
    published "$version" "$dir"
    for p in "${series[@]}"; do
        apply_patch "$dir" "$p" ||
            die "patches/$(basename "$p") does not apply to evcxr $version with the patches before it; vendor/evcxr is unchanged"
    done
}

rebuild() {
    local version=$1 new="$work/evcxr"
    build "$version" "$new"
    cp -a "$patches" "$new/patches"
    # Copied next to vendor/evcxr (one file system), then two renames: the old directory is put
    # back if the second fails.
    local stage="$repo/vendor/.evcxr-rebuild.$$" old="$repo/vendor/.evcxr-old.$$"
    rm -rf "$stage" "$old"
    mkdir "$stage"
    cp -a "$new/." "$stage/"
    chmod "$(umask -S)" "$stage"
    mv "$vendor" "$old"
    if ! mv "$stage" "$vendor"; then
        mv "$old" "$vendor"
        rm -rf "$stage"
        die "could not move the rebuilt directory into place; vendor/evcxr is unchanged"
    fi
    rm -rf "$old"
    echo "vendor/evcxr: evcxr $version and ${#series[@]} patches"
}

check() {
    local version=$1
    build "$version" "$work/series"
    if ! (cd "$work" && diff -ruN --exclude=patches series "$vendor") >"$work/diff"; then
        cat "$work/diff"
        echo
        echo "FAIL: vendor/evcxr is not evcxr $version with vendor/evcxr/patches applied (diff above:"
        echo "the series, then vendor/evcxr). Every change to evcxr is a patch: scripts/evcxr_patches.sh"
        echo "new NAME writes vendor/evcxr's difference as the next one (vendor/evcxr/PATCHES.md)."
        exit 1
    fi
    echo "vendor/evcxr is evcxr $version with its ${#series[@]} patches applied"
}

# A throwaway git repository's commands, whoever runs them.
git_here() {
    git -c user.name=evcxr_patches -c user.email=evcxr_patches@localhost -c commit.gpgsign=false \
        -c core.autocrlf=false "$@"
}

new_patch() {
    local name=$1
    [[ "$name" =~ ^[a-z0-9][a-z0-9-]*$ ]] || die "NAME: lowercase words joined by '-', as 'keep-closures'"
    local last n file
    last=$(basename "${series[-1]}")
    n=$((10#${last%%-*} + 1))
    file=$(printf '%s/%02d-%s.patch' "$patches" "$n" "$name")
    local dir="$work/evcxr"
    build "$EVCXR_VERSION" "$dir"
    git_here -C "$dir" init -q
    git_here -C "$dir" add -A
    git_here -C "$dir" commit -qm series
    find "$dir" -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} +
    (cd "$vendor" && tar -cf - --exclude=./patches .) | tar -xf - -C "$dir"
    git_here -C "$dir" add -A
    git_here -C "$dir" diff --cached --no-color --no-ext-diff --no-renames --src-prefix=a/ --dst-prefix=b/ >"$work/diff"
    [ -s "$work/diff" ] || die "vendor/evcxr is the series already: nothing to put in a patch"
    {
        printf 'evcxr: %s\n\n' "${name//-/ }"
        printf 'What it changes, and why (as for a pull request upstream).\n\n'
        printf 'Tested by: the tests that show it (vendor/evcxr/src, kernel/tests).\n\n'
        cat "$work/diff"
    } >"$file"
    echo "wrote ${file#"$repo"/}: write its header, and its section in vendor/evcxr/PATCHES.md"
}

unpack() {
    local version=$1 dir=$2 p
    [ ! -e "$dir" ] || die "$dir exists"
    mkdir -p "$(dirname "$dir")"
    dir="$(cd "$(dirname "$dir")" && pwd)/$(basename "$dir")"
    published "$version" "$dir"
    git_here -C "$dir" init -q
    git_here -C "$dir" add -A
    git_here -C "$dir" commit -qm "evcxr $version as published (less ${DROPPED[*]})"
    for p in "${series[@]}"; do
        if ! apply_patch "$dir" "$p"; then
            echo "$dir: evcxr $version and the patches before $(basename "$p"), which does not apply."
            echo "Apply it there by hand (cd $dir && patch -p1 --merge < $p), write the result"
            echo "back into the patch under its header (git -C $dir diff), then remove $dir and"
            echo "run unpack again."
            exit 1
        fi
        git_here -C "$dir" add -A
        git_here -C "$dir" commit -qm "$(basename "$p")"
    done
    echo "$dir: evcxr $version and every patch, one commit each."
}

case "${1:-}" in
    rebuild | check | new | unpack) ;;
    *) usage ;;
esac
series=("$patches"/*.patch)
[ -f "${series[0]}" ] || die "no patches in $patches"

case "$1" in
    rebuild) [ $# -le 2 ] || usage; rebuild "${2:-$EVCXR_VERSION}" ;;
    check) [ $# -le 2 ] || usage; check "${2:-$EVCXR_VERSION}" ;;
    new) [ $# -eq 2 ] || usage; new_patch "$2" ;;
    unpack) [ $# -eq 3 ] || usage; unpack "$2" "$3" ;;
    *) usage ;;
esac
