#!/usr/bin/env bash
# check-package.sh: what `cargo package` made is what a user can install.
#
# 1. Every published crate's package carries both licence files, identical
#    to the root's (each crate keeps a plain copy: a package cannot reach
#    outside its directory).
# 2. The packaged `distlock` crate, unpacked from
#    $CARGO_TARGET_DIR/package/distlock-<version>.crate as crates.io would
#    serve it, installs with `cargo install --path` and gives a working CLI:
#    `distlock --help`, and `distlock run` of `true` on a temp SQLite lock
#    file (the embedded default, no server).
#
# Run `cargo package --workspace` first (.ci/run does); without the .crate
# files this script makes them, unverified.
#
# Usage: scripts/check-package.sh
# Environment: CARGO_TARGET_DIR (default: target)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[check-package] %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

target="${CARGO_TARGET_DIR:-target}"
# `cargo package` never packs a crate marked `publish = false` (the bench).
published=(lockcore lock-conformance lock-sqlite lock-redis lock-postgres lock-etcd lock-zookeeper distlock)
version() { local id; id=$(cargo pkgid -p "$1"); echo "${id##*[#@]}"; }
crate_file() { echo "$target/package/$1-$(version "$1").crate"; }

for c in "${published[@]}"; do
  [ -e "$(crate_file "$c")" ] && continue
  log "no $(crate_file "$c"): packing the workspace (unverified)"
  cargo package --workspace --no-verify --quiet
  break
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ---- 1. licence files ------------------------------------------------------------------
for c in "${published[@]}"; do
  crate=$(crate_file "$c")
  dir="$c-$(version "$c")"
  tar -xzf "$crate" -C "$work"
  for licence in LICENSE-MIT LICENSE-APACHE; do
    [ -f "$work/$dir/$licence" ] || die "$crate has no $licence"
    [ ! -L "$work/$dir/$licence" ] || die "$crate: $licence is a symlink"
    cmp -s "$work/$dir/$licence" "$licence" || die "$crate: $licence differs from the root's"
  done
done
log "every published crate carries LICENSE-MIT and LICENSE-APACHE, as at the root"

# ---- 2. the packaged CLI installs and runs ---------------------------------------------
pkg="$work/distlock-$(version distlock)"
# The packaged crate names its workspace siblings by version only, as
# crates.io would serve them; until they are published, point those names at
# their packaged (unpacked) copies, never at the source tree.
patches=()
for c in "${published[@]}"; do
  [ "$c" = distlock ] && continue
  patches+=(--config "patch.crates-io.$c.path=\"$work/$c-$(version "$c")\"")
done
# The package carries the Cargo.lock it was verified with: install with it
# (--locked), every third-party version as locked. Only the workspace
# siblings' entries change: patched to paths, they lose their registry
# source and checksum, as they will not once the siblings are published.
locked=()
if [ -f "$pkg/Cargo.lock" ]; then
  locked=(--locked)
  siblings=" ${published[*]} "
  awk -v siblings="$siblings" '
    /^\[\[package\]\]/ { ours = 0 }
    /^name = / { n = $3; gsub(/"/, "", n); ours = index(siblings, " " n " ") > 0 }
    ours && /^(source|checksum) = / { next }
    { print }
  ' "$pkg/Cargo.lock" >"$work/Cargo.lock" && mv "$work/Cargo.lock" "$pkg/Cargo.lock"
fi
log "cargo install --path $pkg ${locked[*]} (debug profile: reuses the verify build)"
cargo install --quiet --path "$pkg" --root "$work/root" --debug "${locked[@]}" "${patches[@]}"

cli="$work/root/bin/distlock"
"$cli" --help >"$work/help.txt" || die "distlock --help failed"
grep -q 'run' "$work/help.txt" || die "distlock --help does not list 'run': $(cat "$work/help.txt")"
"$cli" --url "sqlite://$work/locks.db" run check-package -- true || die "distlock run ... -- true failed"
[ -f "$work/locks.db" ] || die "distlock run made no lock file at $work/locks.db"
log "the packaged distlock installs; --help and 'run -- true' on a SQLite lock file work"
