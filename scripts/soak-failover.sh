#!/usr/bin/env bash
# Soaks the failover nemesis of the replicated stores: runs each adapter's
# `repeated_failovers_*` tests (tests/failover.rs: a primary, a replica and a
# moving front address; the random workload of four clients while the
# primary is killed and a replica promoted, LOCK_TEST_FAILOVERS times per
# run) N times, each run with fresh seeds, and prints one line per test run
# (backend, test, PASS/FAIL, seed, grants) and a summary. Not run in CI: a
# run takes about 15 s a test. `redis-cluster` runs lock-redis's
# failovers inside a Redis Cluster instead (tests/store/cluster_failover.rs,
# about 6 s a test). Exits 1 if any run failed.
#
#   scripts/soak-failover.sh                 # 20 runs on Redis and PostgreSQL
#   scripts/soak-failover.sh -n 5 redis      # 5 runs on Redis only
#   scripts/soak-failover.sh redis-cluster   # 20 runs inside a Redis Cluster
#   LOCK_TEST_FAILOVERS=6 scripts/soak-failover.sh   # 6 failovers per run
#
# LOCK_TEST_TIME_SCALE and the other LOCK_TEST_* variables apply as usual.
set -uo pipefail

usage() {
    echo "usage: $0 [-n RUNS] [redis|postgres|redis-cluster ...]" >&2
    exit 2
}

runs=20
while getopts "n:h" opt; do
    case $opt in
        n) runs=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[[ $runs =~ ^[1-9][0-9]*$ ]] || usage
backends=("$@")
[ ${#backends[@]} -gt 0 ] || backends=(redis postgres)
for backend in "${backends[@]}"; do
    case $backend in
        redis | postgres | redis-cluster) ;;
        *) usage ;;
    esac
done

cd "$(dirname "$0")/.." || exit 2
logs=$(mktemp -d /tmp/soak-failover.XXXXXX)
# The package, test binary and test name filter of each backend's failovers.
tests_of() {
    case $1 in
        redis-cluster) echo "lock-redis store cluster_failover" ;;
        *) echo "lock-$1 failover repeated_failovers" ;;
    esac
}
for backend in "${backends[@]}"; do
    read -r package binary _ <<<"$(tests_of "$backend")"
    echo "building $package's $binary tests..." >&2
    cargo test -q -p "$package" --all-features --test "$binary" --no-run 2>"$logs/build-$backend.log" ||
        { cat "$logs/build-$backend.log" >&2; exit 2; }
done

failed=0
summary=()
for backend in "${backends[@]}"; do
    passed=0
    total=0
    for ((i = 1; i <= runs; i++)); do
        log="$logs/$backend-$i.log"
        read -r package binary filter <<<"$(tests_of "$backend")"
        cargo test -q -p "$package" --all-features --test "$binary" \
            -- "$filter" --nocapture --test-threads 1 >"$log" 2>&1
        # One FAILOVER line per test that got to its checks (seed, grants).
        grep -o 'FAILOVER .*' "$log" | sed "s/^/run $i: /"
        ok=$(sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\1/p' "$log")
        bad=$(sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\2/p' "$log")
        if [ -z "$ok" ]; then
            echo "run $i: $backend did not run (see $log)"
            failed=$((failed + 1))
            continue
        fi
        if [ "$bad" -gt 0 ]; then
            echo "run $i: $bad FAILED (see $log)"
            failed=$((failed + bad))
        fi
        passed=$((passed + ok))
        total=$((total + ok + bad))
    done
    summary+=("$backend: $passed/$total test runs passed")
done
echo
printf '%s\n' "${summary[@]}"
echo "logs: $logs"
[ "$failed" -eq 0 ]
