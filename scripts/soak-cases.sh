#!/usr/bin/env bash
# Soaks conformance cases: runs the cases whose names contain FILTER
# (default `rw_`, the reader-writer lock cases; `multi_lock_` for the
# multi-locks) N times on each backend, every backend's binary at once (the
# load CI puts on a timing bound, and more), and prints one line per run and
# a summary. Not run in CI. Exits 1 if any run failed.
#
#   scripts/soak-cases.sh                          # 10 runs of rw_ on every backend
#   scripts/soak-cases.sh -n 30 -f multi_lock_ redis sqlite
#
# LOCK_TEST_TIME_SCALE and the LOCK_TEST_* store variables apply as usual.
set -uo pipefail

usage() {
    echo "usage: $0 [-n RUNS] [-f FILTER] [memory|sqlite|redis|redis-cluster|postgres|etcd|zookeeper ...]" >&2
    exit 2
}

runs=10
filter=rw_
while getopts "n:f:h" opt; do
    case $opt in
        n) runs=$OPTARG ;;
        f) filter=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[[ $runs =~ ^[1-9][0-9]*$ ]] || usage
backends=("$@")
[ ${#backends[@]} -gt 0 ] || backends=(memory sqlite redis redis-cluster postgres etcd zookeeper)

# The package, its directory and the conformance binary of each backend.
binary_of() {
    case $1 in
        memory) echo "lock-conformance conformance memory" ;;
        redis-cluster) echo "lock-redis lock-redis cluster" ;;
        sqlite | redis | postgres | etcd | zookeeper) echo "lock-$1 lock-$1 conformance" ;;
        *) usage ;;
    esac
}

cd "$(dirname "$0")/.." || exit 2
logs=$(mktemp -d /tmp/soak-cases.XXXXXX)
declare -A exe dir
for backend in "${backends[@]}"; do
    read -r package directory binary <<<"$(binary_of "$backend")"
    echo "building $package's $binary tests..." >&2
    path=$(cargo test -p "$package" --all-features --test "$binary" --no-run \
        --message-format=json 2>"$logs/build-$backend.log" \
        | grep '"reason":"compiler-artifact"' | grep -v '"executable":null' \
        | grep "\"name\":\"$binary\"" | sed -E 's/.*"executable":"([^"]*)".*/\1/' | tail -1)
    [ -n "$path" ] || { cat "$logs/build-$backend.log" >&2; exit 2; }
    exe[$backend]=$path
    dir[$backend]=$PWD/$directory
done

failed=0
declare -A passed total
for ((i = 1; i <= runs; i++)); do
    for backend in "${backends[@]}"; do
        (cd "${dir[$backend]}" && "${exe[$backend]}" "$filter" --test-threads 4) \
            >"$logs/$backend-$i.log" 2>&1 &
    done
    wait
    for backend in "${backends[@]}"; do
        log="$logs/$backend-$i.log"
        ok=$(sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\1/p' "$log")
        bad=$(sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\2/p' "$log")
        if [ -z "$ok" ]; then
            echo "run $i: $backend did not run (see $log)"
            failed=$((failed + 1))
            continue
        fi
        if [ "$bad" -gt 0 ]; then
            echo "run $i: $backend: $bad FAILED (see $log):"
            grep -E '^test .* FAILED|Failure|failed:' "$log" | head -5 | sed 's/^/    /'
            failed=$((failed + bad))
        fi
        passed[$backend]=$((${passed[$backend]:-0} + ok))
        total[$backend]=$((${total[$backend]:-0} + ok + bad))
    done
done
echo
for backend in "${backends[@]}"; do
    echo "$backend: ${passed[$backend]:-0}/${total[$backend]:-0} case runs passed"
done
echo "logs: $logs"
[ "$failed" -eq 0 ]
