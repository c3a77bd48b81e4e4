#!/usr/bin/env bash
# Runs the Eclipse Paho MQTT v5 interoperability suite
# (paho.mqtt.testing, interoperability/client_test5.py) against luffymq and
# vanilla Mochi MQTT 2.7.9, one test at a time, each on a fresh broker of
# its own on a free loopback port, and prints a markdown table of the
# results. Exits 1 when luffymq never passes a test that vanilla Mochi
# passed; a test the two disagree on is run RERUNS (2) more times on both,
# since some of the suite's tests race with the broker.
#
# Usage: scripts/paho-interop.sh PAHO_TESTING_DIR [OUT.md]
#   PAHO_TESTING_DIR: a checkout of github.com/eclipse/paho.mqtt.testing
#   (it is not vendored: its own license, and it is not on apt or npm).
# Needs python3. Set TESTS="test_basic test_flow_control1" to run a subset,
# LUFFYMQ_ARGS to pass flags to luffymq.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
paho="${1:?usage: scripts/paho-interop.sh PAHO_TESTING_DIR [OUT.md]}"
out="${2:-}"
suite="$paho/interoperability/client_test5.py"
[ -f "$suite" ] || { echo "paho-interop: $suite not found" >&2; exit 2; }
command -v python3 >/dev/null || { echo "paho-interop: python3 not found" >&2; exit 2; }

bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
(cd "$root" && go build -o "$bin/" ./cmd/luffymq ./cmd/luffy-bench)

tests="${TESTS:-$(grep -o 'def test_[a-z0-9_]*' "$suite" | sed 's/def //')}"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# start_broker SYSTEM PORT: starts the broker in the background, sets pid.
start_broker() {
  case "$1" in
    luffymq) "$bin/luffymq" --listen "127.0.0.1:$2" --http "" ${LUFFYMQ_ARGS:-} >"$bin/broker.log" 2>&1 & ;;
    mochi) "$bin/luffy-bench" mochi-server --listen "127.0.0.1:$2" >"$bin/broker.log" 2>&1 & ;;
  esac
  pid=$!
  for _ in $(seq 100); do
    if python3 -c "import socket; socket.create_connection(('127.0.0.1',$2),0.2).close()" 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "paho-interop: $1 did not listen on port $2" >&2
  cat "$bin/broker.log" >&2
  return 1
}

# run_test SYSTEM TEST: runs TEST once on a fresh SYSTEM broker; adds to
# the pass and run counts.
declare -A passes runs
run_test() {
  local system=$1 t=$2 port
  port="$(free_port)"
  start_broker "$system" "$port"
  runs[$system/$t]=$(( ${runs[$system/$t]:-0} + 1 ))
  if (cd "$paho/interoperability" && timeout 120 python3 client_test5.py -p "$port" "Test.$t" >"$bin/test.log" 2>&1); then
    passes[$system/$t]=$(( ${passes[$system/$t]:-0} + 1 ))
    echo "$system $t pass" >&2
  else
    echo "$system $t FAIL" >&2
    tail -5 "$bin/test.log" >&2
  fi
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# verdict SYSTEM TEST: pass, FAIL, or flaky (passes/runs).
verdict() {
  local p=${passes[$1/$2]:-0} n=${runs[$1/$2]}
  if [ "$p" -eq "$n" ]; then echo pass; elif [ "$p" -eq 0 ]; then echo FAIL; else echo "flaky ($p of $n passed)"; fi
}

for t in $tests; do
  run_test mochi "$t"
  run_test luffymq "$t"
  # Some of the suite's tests race with the broker (client_test5.py's
  # test_subscribe_options waits on the wrong client's callback): where
  # the two brokers disagree, both run it RERUNS more times.
  if [ "${passes[mochi/$t]:-0}" != "${passes[luffymq/$t]:-0}" ]; then
    for _ in $(seq "${RERUNS:-2}"); do run_test mochi "$t"; run_test luffymq "$t"; done
  fi
done

regressions=0
{
  echo "| client_test5.py test | vanilla Mochi 2.7.9 | luffymq |"
  echo "|---|---|---|"
  for t in $tests; do
    mark=""
    # A regression: vanilla Mochi passed it at least once, luffymq never.
    if [ "${passes[mochi/$t]:-0}" -gt 0 ] && [ "${passes[luffymq/$t]:-0}" -eq 0 ]; then
      mark=" ⚠ regression"; regressions=$((regressions + 1))
    fi
    echo "| $t | $(verdict mochi "$t") | $(verdict luffymq "$t")$mark |"
  done
  echo
  echo "$regressions regression(s) against vanilla Mochi (each test on a fresh broker; tests the two disagree on run ${RERUNS:-2} more times on both)."
} | tee ${out:+"$out"}
[ "$regressions" -eq 0 ]
