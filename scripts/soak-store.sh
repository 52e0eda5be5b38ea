#!/usr/bin/env bash
# Soaks an adapter's own tests against its store: runs the tests of
# lock-BACKEND's test binary (`store` by default) whose names contain any
# FILTER, RUNS times, each run beside BUSY busy loops (CPU taken from the
# test, as CI's other test binaries take it; 1 by default), and prints one
# line per run (PASS/FAIL, seconds, the first panic) and a summary. What a
# new fault or timing test goes through before it is trusted. Not run in
# CI. Exits 1 if any run failed; the failed runs' logs are kept.
#
#   scripts/soak-store.sh zookeeper wakeups::a_waiter_whose_create
#   scripts/soak-store.sh -n 50 -b 2 postgres turnstile grants
#   scripts/soak-store.sh -t failover redis lock_delay
#
# LOCK_TEST_TIME_SCALE, LOCK_TEST_LOG and the LOCK_TEST_* store variables
# apply as usual.
set -uo pipefail

usage() {
    echo "usage: $0 [-n RUNS] [-b BUSY] [-t TEST_BINARY] sqlite|redis|postgres|etcd|zookeeper FILTER..." >&2
    exit 2
}

runs=20
busy=1
binary=store
while getopts "n:b:t:h" opt; do
    case $opt in
        n) runs=$OPTARG ;;
        b) busy=$OPTARG ;;
        t) binary=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[[ $runs =~ ^[1-9][0-9]*$ && $busy =~ ^[0-9]+$ && $binary =~ ^[a-z_]+$ ]] || usage
[ $# -ge 2 ] || usage
backend=$1
shift
case $backend in
    sqlite | redis | postgres | etcd | zookeeper) ;;
    *) usage ;;
esac
filters=("$@")

cd "$(dirname "$0")/.." || exit 2
logs=$(mktemp -d /tmp/soak-store.XXXXXX)
test_cmd=(cargo test -q -p "lock-$backend" --all-features --test "$binary")
echo "building lock-$backend's $binary tests..." >&2
"${test_cmd[@]}" --no-run 2>"$logs/build.log" || { cat "$logs/build.log" >&2; exit 2; }

loops=()
stop_loops() { [ ${#loops[@]} -eq 0 ] || kill "${loops[@]}" 2>/dev/null; }
trap stop_loops EXIT
for ((i = 0; i < busy; i++)); do
    (while :; do :; done) &
    loops+=($!)
done

failed=0
printf '%-4s %-4s %7s  %s\n' run rslt secs note
for ((i = 1; i <= runs; i++)); do
    log="$logs/run-$i.log"
    started=$(date +%s%N)
    if "${test_cmd[@]}" -- "${filters[@]}" >"$log" 2>&1 && ! grep -q '^running 0 tests' "$log"; then
        result=PASS
        note=""
    else
        result=FAIL
        failed=$((failed + 1))
        note=$(grep -m1 -A1 'panicked at' "$log" | tail -1 | cut -c1-160)
        grep -q '^running 0 tests' "$log" && note="no test matches: ${filters[*]}"
        note="${note:-see $log}"
    fi
    secs=$(awk -v ns=$(($(date +%s%N) - started)) 'BEGIN { printf "%.1f", ns / 1e9 }')
    printf '%-4s %-4s %7s  %s\n' "$i" "$result" "$secs" "$note"
    [ "$result" = FAIL ] || rm -f "$log"
done
echo
echo "lock-$backend $binary [${filters[*]}]: $((runs - failed))/$runs passed beside $busy busy loop(s)"
[ "$failed" -eq 0 ] && rm -rf "$logs" || echo "logs of failed runs: $logs"
[ "$failed" -eq 0 ]
