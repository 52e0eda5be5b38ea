#!/usr/bin/env bash
# mutants.sh: mutation testing (cargo-mutants) of one crate's safety code
# against that crate's tests; lockcore's against its own tests and the
# conformance suite on the in-memory backend. Not part of CI: a mutant costs
# a build and a test run, tens of seconds each. See docs/testing.md,
# "Mutation testing".
#
# Usage: scripts/mutants.sh [CRATE] [FILE...]
#   CRATE  lockcore (default) or an adapter crate (lock-sqlite, lock-redis, ...)
#   FILE   source files to mutate (lockcore/src/renewer.rs ...); default for
#          lockcore: its safety files (renewer, lease, clock, guard, fenced,
#          backend/wait, locker, capabilities); for an adapter: all of its src/
# Environment:
#   MUTANTS_JOBS   mutants built and tested at once [1] (each needs a core)
#   MUTANTS_FRESH  1: forget earlier results and test every mutant again
#   MUTANTS_ARGS   more cargo-mutants arguments, split on spaces (e.g. "--list")
#   MUTANTS_TIMEOUT  lockcore's second pass: seconds a mutant's tests may
#                  take [120] (that pass runs no baseline to time them by)
#   MUTANTS_TESTS  the first pass's test binaries only, to save builds (e.g.
#                  "guard renewer locker" for renewer.rs; "lib" for the unit
#                  tests); default: all of the crate's. lockcore's second pass
#                  always runs all of them.
#   MUTANTS_FILTER the first pass's tests whose names contain this only
#                  (libtest's filter, e.g. "restore::"): for mutants that break
#                  every test of a binary at once, which would otherwise run
#                  until the timeout; default: every test
#   MUTANTS_THREADS the first pass's tests run at once per binary (libtest's
#                  --test-threads; the test command runs 4); default: one per
#                  core. Store tests mostly wait on timers and servers, so
#                  more than one per core shortens a pass.
#
# Every run starts where the last left off: the mutants already caught or
# unviable for the same sources (the ledger, mutants.out.ledger/CRATE) are
# skipped. lockcore runs in two passes: its own tests first (they build
# fast), then the conformance suite on MemoryBackend for the survivors only;
# a mutant is caught if either pass catches it. The per-file table of the
# ledger is printed at the end and kept in mutants.out.ledger/CRATE/table.md.
set -euo pipefail
cd "$(dirname "$0")/.."

crate=${1:-lockcore}
shift || true
jobs=${MUTANTS_JOBS:-1}
read -r -a extra <<<"${MUTANTS_ARGS:-}"
log() { printf '[mutants] %s\n' "$*" >&2; }

command -v cargo-mutants >/dev/null || {
  log "cargo-mutants is missing: cargo install cargo-mutants --locked (25 or later)"
  exit 2
}
# Each crate lives in the directory of its name (lockcore, lock-sqlite, ...).
dir=$crate
[ -f "$dir/Cargo.toml" ] || {
  log "no crate directory $dir/ in this workspace"
  exit 2
}

files=("$@")
if [ ${#files[@]} -eq 0 ] && [ "$crate" = lockcore ]; then
  for f in renewer lease clock guard fenced backend/wait locker capabilities; do
    files+=("lockcore/src/$f.rs")
  done
fi
filters=()
for f in "${files[@]}"; do filters+=(--file "$f"); done

# ---- the ledger: the latest outcome of every mutant of these sources -------------------
ledger=mutants.out.ledger/$crate
sources=$(find "$dir/src" -name '*.rs' -print0 | sort -z | xargs -0 sha1sum | sha1sum | cut -c1-40)
if [ "${MUTANTS_FRESH:-0}" = 1 ] || [ "$(cat "$ledger/sources" 2>/dev/null)" != "$sources" ]; then
  rm -rf "$ledger"
fi
mkdir -p "$ledger"
echo "$sources" >"$ledger/sources"
touch "$ledger/outcomes"

# Hands cargo-mutants (--iterate) what the ledger already settled. The last
# pass's output stays whole: cargo-mutants moves it to mutants.out.old.
seed() {
  mkdir -p mutants.out
  rm -f mutants.out/lock.json
  awk -F'\t' '$1 == "caught" || $1 == "unviable" { print $2 }' "$ledger/outcomes" \
    >mutants.out/previously_caught.txt
}

# Folds the run's outcomes into the ledger: the latest outcome of a mutant wins.
record() {
  local kind
  for kind in caught missed timeout unviable; do
    [ -f "mutants.out/$kind.txt" ] && sed "s/^/$kind\t/" "mutants.out/$kind.txt"
  done >"$ledger/new"
  awk -F'\t' 'FILENAME == ARGV[1] { latest[$2] = $1; next } !($2 in latest) { print }' \
    "$ledger/new" "$ledger/outcomes" | cat - "$ledger/new" | sort -t$'\t' -k2 >"$ledger/merged"
  mv "$ledger/merged" "$ledger/outcomes"
  rm -f "$ledger/new"
}

# The mutants the settings select now, and those of them not caught yet.
cargo mutants --list --package "$crate" "${filters[@]}" >"$ledger/listed"
current() {
  awk -F'\t' 'FILENAME == ARGV[1] { listed[$0] = 1; next } $2 in listed' "$ledger/listed" "$ledger/outcomes"
}
survivors() { current | grep -cE '^(missed|timeout)' || true; }

pass() { # label, then cargo-mutants arguments
  local label=$1 start rc=0
  shift
  start=$(date +%s)
  log "$label"
  seed
  cargo mutants --iterate --jobs "$jobs" --all-features --package "$crate" \
    "${filters[@]}" "${extra[@]}" "$@" || rc=$?
  record # what was tested counts, even if the run was cut short
  # 0: all caught; 2: some missed; 3: some timed out. Anything else is a failure of the run.
  case $rc in 0 | 2 | 3) ;; *)
    log "cargo mutants failed ($rc): see mutants.out/debug.log"
    exit "$rc"
    ;;
  esac
  log "$label: $(($(date +%s) - start)) s"
}

# Test binaries: the crate's unit and integration tests, no doctests (they
# compile one by one, and a doc example is no test of behaviour).
targets=(--lib)
for t in "$dir"/tests/*.rs; do
  [ -e "$t" ] && targets+=(--test "$(basename "$t" .rs)")
done
# A binary of several files: tests/NAME/main.rs (an adapter's store tests).
for t in "$dir"/tests/*/main.rs; do
  [ -e "$t" ] && targets+=(--test "$(basename "$(dirname "$t")")")
done

first=("${targets[@]}")
if [ -n "${MUTANTS_TESTS:-}" ]; then
  first=()
  for t in $MUTANTS_TESTS; do
    if [ "$t" = lib ]; then first+=(--lib); else first+=(--test "$t"); fi
  done
fi
libtest=()
[ -z "${MUTANTS_FILTER:-}" ] || libtest+=("$MUTANTS_FILTER")
[ -z "${MUTANTS_THREADS:-}" ] || libtest+=(--test-threads "$MUTANTS_THREADS")
[ ${#libtest[@]} -eq 0 ] || first+=(-- "${libtest[@]}")
pass "$crate: its own tests (${first[*]})" -- "${first[@]}"
if [ "$crate" = lockcore ] && [ "$(survivors)" -gt 0 ]; then
  # No baseline: cargo-mutants runs it on the mutated package alone, which
  # has no `memory` target. Without one, the test timeout is explicit.
  pass "lockcore: survivors against the conformance suite on MemoryBackend" \
    --baseline=skip --timeout "${MUTANTS_TIMEOUT:-120}" \
    --test-package lockcore --test-package lock-conformance -- "${targets[@]}" --test memory
fi

# The mutated copies built into the same target dir under the same names, and
# cargo may take the last mutant's artifacts as fresh for this tree: make it
# rebuild them.
find "$dir" -name '*.rs' -exec touch {} +

# ---- the table ------------------------------------------------------------------------------
# Over the mutants the settings select now (an exclusion added since a run drops out).
current >"$ledger/current"
untested=$(awk -F'\t' 'FILENAME == ARGV[1] { seen[$2] = 1; next } !($0 in seen)' "$ledger/current" "$ledger/listed" | wc -l)
{
  echo "| file | mutants | caught | missed | timeout | unviable | score |"
  echo "|---|---|---|---|---|---|---|"
  awk -F'\t' '
    { split($2, loc, ":"); f = loc[1]; files[f] = 1; n[f, $1]++ }
    END {
      for (f in files) {
        c = n[f, "caught"] + 0; m = n[f, "missed"] + 0; t = n[f, "timeout"] + 0; u = n[f, "unviable"] + 0
        viable = c + m + t
        score = viable ? sprintf("%.0f%%", 100 * c / viable) : "-"
        printf "| %s | %d | %d | %d | %d | %d | %s |\n", f, c + m + t + u, c, m, t, u, score
      }
    }' "$ledger/current" | sort
} >"$ledger/table.md"
cat "$ledger/table.md"
[ "$untested" -eq 0 ] || echo "($untested mutants of these files not tested yet)"
if grep -qE '^(missed|timeout)' "$ledger/current"; then
  echo
  echo "Surviving mutants:"
  grep -E '^(missed|timeout)' "$ledger/current" | sed 's/^/  /'
fi
