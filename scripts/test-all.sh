#!/usr/bin/env bash
# test-all.sh: install the store servers that are missing (Debian, as root),
# then run the whole test suite against real Redis, PostgreSQL, etcd and
# ZooKeeper, which the tests launch themselves as child processes; then
# lock-zookeeper's conformance suite again, over TLS.
#
# Usage: scripts/test-all.sh [extra `cargo test` arguments...]
#   e.g. scripts/test-all.sh -p lock-redis
# Environment:
#   LOCK_TEST_JOBS         test binaries run at once [3]
#   LOCK_TEST_THREADS      test threads per test binary [4] (cases mostly sleep)
#   LOCK_TEST_TIME_SCALE   stretch every timing in the suite [1.0]
#   LOCK_TEST_*_URL ...    use running servers instead (see docs/testing.md)
#   SKIP_INSTALL=1         do not install anything
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test-all] %s\n' "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
T0=$(now)

# ---- install what is missing ---------------------------------------------------------
# Store servers, their CLIs (the launcher's own tests verify through them),
# libfaketime (PostgreSQL clock-step tests), protoc + the well-known .proto
# files (the etcd-client crate's build.rs compiles protobufs).
PKGS=(redis-server redis-tools etcd-server etcd-client zookeeper protobuf-compiler libprotobuf-dev faketime libfaketime)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# Any PostgreSQL server version will do.
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || missing+=(postgresql)
command -v psql >/dev/null || missing+=(postgresql-client)

if [ ${#missing[@]} -gt 0 ] && [ "${SKIP_INSTALL:-0}" != 1 ]; then
  if [ "$(id -u)" != 0 ]; then
    log "missing packages: ${missing[*]}"
    log "run as root, or: sudo apt-get install -y --no-install-recommends ${missing[*]}"
    exit 1
  fi
  command -v apt-get >/dev/null || { log "no apt-get: install ${missing[*]} by hand"; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  # No package may start its server (no systemd here; init scripts would).
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
  fi
  t=$(now)
  # apt-get update only when the package lists are empty or stale enough to fail.
  compgen -G '/var/lib/apt/lists/*_Packages' >/dev/null || apt-get update -qq
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/test-all-apt.log 2>&1; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/test-all-apt.log 2>&1 \
      || { tail -30 /tmp/test-all-apt.log >&2; log "apt-get install failed"; exit 1; }
  fi
  log "installed ${missing[*]} in $(since "$t") s"
elif [ ${#missing[@]} -gt 0 ]; then
  log "SKIP_INSTALL=1: not installing ${missing[*]} (tests needing them will fail)"
else
  log "all store packages present"
fi

# ---- run the suite ----------------------------------------------------------------------
# Every test binary built once, then run several at a time (their cases
# mostly wait on stores and timers): scripts/run-tests.sh.
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
t=$(now)
log "scripts/run-tests.sh $* (LOCK_TEST_JOBS=${LOCK_TEST_JOBS:-3} binaries at a time, LOCK_TEST_THREADS=${LOCK_TEST_THREADS:-4} threads each)"
status=0
scripts/run-tests.sh "$@" || status=$?
log "tests finished in $(since "$t") s (total $(since "$T0") s), exit $status"

# ---- ZooKeeper over TLS ---------------------------------------------------------------
# lock-zookeeper's conformance suite once more, every server the kit launches
# serving TLS only (LOCK_TEST_ZOOKEEPER_TLS=1, a CA of its own each): the
# binary the run above built (same flags, so nothing is rebuilt), run alone.
# Not when the arguments pick other packages, nor against an external
# server (LOCK_TEST_ZOOKEEPER_URL: the kit launches nothing then).
if [ $# -gt 0 ] && [[ " $* " != *lock-zookeeper* ]]; then
  log "ZooKeeper over TLS: skipped (the arguments pick other packages)"
elif [ -n "${LOCK_TEST_ZOOKEEPER_URL:-}" ]; then
  log "ZooKeeper over TLS: skipped (LOCK_TEST_ZOOKEEPER_URL names an external server)"
else
  t=$(now)
  exe=$(cargo test --workspace --all-features --no-run --message-format=json "$@" 2>/dev/null \
    | grep '"reason":"compiler-artifact"' | grep '/lock-zookeeper/Cargo.toml"' \
    | grep '"kind":\["test"\],[^}]*"name":"conformance"' | grep -v '"executable":null' \
    | sed -E 's/.*"executable":"([^"]*)".*/\1/' | head -1)
  if [ -z "$exe" ]; then
    log "ZooKeeper over TLS: no lock-zookeeper conformance binary was built"
    status=1
  else
    tls_log=$(mktemp "${TMPDIR:-/tmp}/distlock-zk-tls.XXXXXX")
    tls_status=0
    (cd lock-zookeeper && CARGO_MANIFEST_DIR="$PWD" LOCK_TEST_ZOOKEEPER_TLS=1 \
      "$exe" --test-threads "${LOCK_TEST_THREADS:-4}") >"$tls_log" 2>&1 || tls_status=$?
    printf '\n=== lock-zookeeper/conformance over TLS (%s s, exit %s)\n' "$(since "$t")" "$tls_status"
    cat "$tls_log"
    if [ "$tls_status" != 0 ]; then
      printf '\n=== FAILED: lock-zookeeper/conformance over TLS\n' >&2
      grep -E '^(test .* FAILED|failures:|---- )|panicked at' "$tls_log" >&2 || tail -20 "$tls_log" >&2
      status=1
    fi
    rm -f "$tls_log"
    log "ZooKeeper conformance over TLS finished in $(since "$t") s, exit $tls_status"
  fi
fi
log "all done in $(since "$T0") s, exit $status"
exit $status
