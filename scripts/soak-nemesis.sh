#!/usr/bin/env bash
# Soaks the nemesis conformance case (nemesis_history_is_clean): runs it over
# N random seeds per backend and prints one line per run (backend, seed,
# PASS/FAIL, grants and the least the run had to make) and a summary. Not run
# in CI: it takes about 20 s a run. Exits 1 if any run failed.
#
#   scripts/soak-nemesis.sh                  # 20 seeds on each of the four backends
#   scripts/soak-nemesis.sh -n 50 zookeeper  # 50 seeds on ZooKeeper only
#
# Replay a failing seed (same fault schedule and operation choices):
#   LOCK_TEST_NEMESIS_SEED=<seed> cargo test -p lock-<backend> --all-features \
#     --test conformance -- --exact nemesis_history_is_clean --nocapture
#
# LOCK_TEST_TIME_SCALE and the LOCK_TEST_* store variables apply as usual.
# LOCK_TEST_LOG=lock_<backend>=debug keeps the adapter's debug log in each
# run's log (in the folder printed at the end).
set -uo pipefail

usage() {
    echo "usage: $0 [-n RUNS] [redis|postgres|etcd|zookeeper ...]" >&2
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
[ ${#backends[@]} -gt 0 ] || backends=(redis postgres etcd zookeeper)
for backend in "${backends[@]}"; do
    case $backend in
        redis | postgres | etcd | zookeeper) ;;
        *) usage ;;
    esac
done

cd "$(dirname "$0")/.." || exit 2
logs=$(mktemp -d /tmp/soak-nemesis.XXXXXX)
for backend in "${backends[@]}"; do
    echo "building lock-$backend's conformance tests..." >&2
    cargo test -q -p "lock-$backend" --all-features --test conformance --no-run 2>"$logs/build-$backend.log" ||
        { cat "$logs/build-$backend.log" >&2; exit 2; }
done

failed=0
summary=()
printf '%-10s %-20s %-4s %7s %5s  %s\n' backend seed rslt grants least note
for backend in "${backends[@]}"; do
    passed=0
    for ((i = 1; i <= runs; i++)); do
        seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
        log="$logs/$backend-$seed.log"
        if LOCK_TEST_NEMESIS_SEED=$seed cargo test -q -p "lock-$backend" --all-features --test conformance \
            -- --exact nemesis_history_is_clean --nocapture >"$log" 2>&1; then
            result=PASS
            passed=$((passed + 1))
            note=""
        else
            result=FAIL
            failed=$((failed + 1))
            note=$(grep -m1 -o 'failed after .*' "$log" | cut -c1-160)
            note="${note:-see $log}"
        fi
        line=$(grep -m1 '^NEMESIS ' "$log")
        grants=$(sed -n 's/.* grants=\([0-9]*\).*/\1/p' <<<"$line")
        least=$(sed -n 's/.* min=\([0-9]*\).*/\1/p' <<<"$line")
        printf '%-10s %-20s %-4s %7s %5s  %s\n' "$backend" "$seed" "$result" "${grants:--}" "${least:--}" "$note"
    done
    summary+=("$backend: $passed/$runs passed")
done
echo
printf '%s\n' "${summary[@]}"
echo "logs: $logs"
[ "$failed" -eq 0 ]
