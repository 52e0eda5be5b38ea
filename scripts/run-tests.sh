#!/usr/bin/env bash
# run-tests.sh: build every test binary of the workspace once, then run
# them several at a time, longest first, each in its package's directory
# as `cargo test` would. The suite's cases mostly wait on stores and
# timers, so binaries run side by side; within a binary, cases run on
# LOCK_TEST_THREADS threads. Each binary's output is printed whole when it
# ends (never interleaved), then a summary; a failed binary's output is
# printed again at the end.
#
# Usage: scripts/run-tests.sh [extra `cargo test` arguments...]
#   e.g. scripts/run-tests.sh -p lock-redis
# Environment:
#   LOCK_TEST_JOBS      test binaries at once [3]
#   LOCK_TEST_THREADS   test threads per binary [4]
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=${LOCK_TEST_JOBS:-3}
threads=${LOCK_TEST_THREADS:-4}
target=${CARGO_TARGET_DIR:-$PWD/target}
work=$(mktemp -d "${TMPDIR:-/tmp}/distlock-tests.XXXXXX")
trap 'rm -rf "$work"' EXIT
times="$target/test-times"

log() { printf '[run-tests] %s\n' "$*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ---- build ------------------------------------------------------------------------------
t=$(now)
cargo test --workspace --all-features --no-run --message-format=json-render-diagnostics "$@" \
  >"$work/build.json"
# One line per test binary: its package directory, then its path.
grep '"reason":"compiler-artifact"' "$work/build.json" \
  | grep -E '"profile":\{[^}]*"test":true' | grep -v '"executable":null' \
  | sed -E 's/.*"manifest_path":"([^"]*)\/Cargo\.toml".*"executable":"([^"]*)".*/\1 \2/' \
  | sort -u >"$work/binaries"
log "built $(wc -l <"$work/binaries") test binaries in $(elapsed "$t") s"

# ---- order: longest first, by the last run's times (slow kinds first on a first run) -----
last() { if [ -f "$times" ]; then awk -v n="$1" '$1 == n { print $2 }' "$times" | tail -1; fi; }
while read -r dir exe; do
  name=$(basename "$exe" | sed -E 's/-[0-9a-f]{16}$//')
  secs=$(last "$(basename "$dir")/$name")
  if [ -z "$secs" ]; then
    case $name in
      store | conformance* | broken* | scale* | stores) secs=60 ;;
      *) secs=5 ;;
    esac
  fi
  printf '%s %s %s %s\n' "$secs" "$dir" "$exe" "$name"
done <"$work/binaries" | sort -rn >"$work/queue"
# The doctests compile as they run: one more job, started first.
printf '%s %s %s %s\n' 999 "$PWD" doctests doctests | cat - "$work/queue" >"$work/queue.all"

# ---- run ----------------------------------------------------------------------------------
run_one() { # secs dir exe name -> $work/out/<n>.{log,rc,secs}
  local n=$1 dir=$2 exe=$3 name=$4 start
  start=$(now)
  if [ "$exe" = doctests ]; then
    (cargo test --workspace --all-features --doc "${extra[@]}" -- --test-threads "$threads") \
      >"$work/out/$n.log" 2>&1 && echo 0 >"$work/out/$n.rc" || echo $? >"$work/out/$n.rc"
  else
    (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe" --test-threads "$threads") \
      >"$work/out/$n.log" 2>&1 && echo 0 >"$work/out/$n.rc" || echo $? >"$work/out/$n.rc"
  fi
  elapsed "$start" >"$work/out/$n.secs"
}
extra=("$@")
mkdir -p "$work/out"
t=$(now)
n=0
declare -A label shown
failed=()
# Prints every binary that is done and not shown yet, whole.
show_done() {
  local i rc
  for i in $(seq 1 "$n"); do
    [ -n "${shown[$i]:-}" ] && continue
    [ -f "$work/out/$i.secs" ] || continue
    shown[$i]=1
    rc=$(cat "$work/out/$i.rc")
    printf '\n=== %s (%s s, exit %s)\n' "${label[$i]}" "$(cat "$work/out/$i.secs")" "$rc"
    cat "$work/out/$i.log"
    [ "$rc" = 0 ] || failed+=("$i")
  done
}
# The scale binaries (thousands of locks and waiters, request and loss
# counts per renew tick) run last, one at a time with nothing beside them:
# side by side with each other they starved each other's renewers.
: >"$work/alone"
while read -r secs dir exe name; do
  if [ "$name" = scale ]; then
    printf '%s %s %s %s\n' "$secs" "$dir" "$exe" "$name" >>"$work/alone"
    continue
  fi
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
    wait -n || true
    show_done
  done
  n=$((n + 1))
  label[$n]="$(basename "$dir")/$name"
  run_one "$n" "$dir" "$exe" "$name" &
done <"$work/queue.all"
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
  wait -n || true
  show_done
done
wait
show_done
while read -r _ dir exe name; do
  n=$((n + 1))
  label[$n]="$(basename "$dir")/$name"
  run_one "$n" "$dir" "$exe" "$name"
  show_done
done <"$work/alone"

# ---- summary ------------------------------------------------------------------------------
for i in $(seq 1 "$n"); do
  printf '%s %s\n' "${label[$i]}" "$(cat "$work/out/$i.secs")"
done | sort -k2 -rn >"$work/times"
mkdir -p "$target" && cp "$work/times" "$times"
read -r passed failed_tests ignored < <(cat "$work"/out/*.log \
  | sed -nE 's/^test result: [A-Za-z.]+ ([0-9]+) passed; ([0-9]+) failed; ([0-9]+) ignored.*/\1 \2 \3/p' \
  | awk '{ p += $1; f += $2; i += $3 } END { print p + 0, f + 0, i + 0 }')
log "ran $n binaries in $(elapsed "$t") s with $jobs at a time: $passed passed, $failed_tests failed, $ignored ignored"
log "slowest: $(head -5 "$work/times" | tr '\n' ' ')"
if [ "${#failed[@]}" -gt 0 ]; then
  for i in "${failed[@]}"; do
    printf '\n=== FAILED: %s\n' "${label[$i]}" >&2
    grep -E '^(test .* FAILED|failures:|---- )|panicked at' "$work/out/$i.log" >&2 || tail -20 "$work/out/$i.log" >&2
  done
  exit 1
fi
