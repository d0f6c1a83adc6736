#!/bin/bash
# One member's CPU per request, split into idle polling and the rest.
#
#   bench/scripts/member-cpu.sh CAIRN_BIN put|range [member flags...]
#
# Starts CAIRN_BIN with a fresh data directory and the given flags (e.g.
# `--cores 1`), puts for 2 s (and ranges for 1 s before a range run) to warm
# it up, then runs the workload for 5 s (100 clients over 10 connections, as
# `cairn-bench compare`'s put-100 and range-s) and prints requests/s, the
# member's user + system CPU per request (/proc/PID/stat), the part of it
# spent in idle polls (cairn_core_idle_poll_duration_seconds_sum), WAL
# flushes, idle polls, and the member's voluntary and involuntary context
# switches per request (per thread from /proc/PID/task/*/status, a thread
# started meanwhile counted from zero; a thread that exited meanwhile, such
# as an io_uring worker, cannot be read, and the count of those is printed).
# Uses port 2379; CAIRN_BENCH overrides the load generator (default
# target/release/cairn-bench).
set -euo pipefail
BIN=$1; W=$2; shift 2
BENCH=${CAIRN_BENCH:-target/release/cairn-bench}
DIR=$(mktemp -d /var/tmp/member-cpu.XXXXXX)
"$BIN" --data-dir "$DIR/data" "$@" > "$DIR/member.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do curl -sf 127.0.0.1:2379/readyz > /dev/null && break; sleep 0.1; done
PUT="put --key-size 8 --val-size 256 --key-space-size 100000"
RANGE="range 00000000 --consistency s"
if [ "$W" = put ]; then LOAD=$PUT; else LOAD=$RANGE; fi
run() { "$BENCH" --conns 10 --clients 100 --warmup 0s "$@"; }
run --duration 2s $PUT > /dev/null
[ "$W" = put ] || run --duration 1s $LOAD > /dev/null
metric() { grep -E "^$1" "$DIR/$2" | sed 's/{.*}//' | awk '{s += $2} END {printf "%.9f", s + 0}'; }
ticks() { awk '{print $14 + $15}' /proc/$PID/stat; }
# One line per thread: tid, voluntary and involuntary context switches.
switches() {
  for t in /proc/$PID/task/*; do
    awk -v tid="${t##*/}" '/^voluntary_ctxt/ {v = $2} /^nonvoluntary_ctxt/ {n = $2} END {if (NR) print tid, v + 0, n + 0}' "$t/status" 2>/dev/null || true
  done
}
curl -s 127.0.0.1:2379/metrics > "$DIR/m0"
switches > "$DIR/s0"
T0=$(ticks)
N=$(run --duration 5s $LOAD | awk '/^\| requests \|/ {print $4}')
T1=$(ticks)
switches > "$DIR/s1"
curl -s 127.0.0.1:2379/metrics > "$DIR/m1"
python3 - "$N" "$T0" "$T1" "$(getconf CLK_TCK)" \
  "$(metric cairn_core_idle_poll_duration_seconds_sum m0)" "$(metric cairn_core_idle_poll_duration_seconds_sum m1)" \
  "$(metric cairn_core_wal_fsync_duration_seconds_count m0)" "$(metric cairn_core_wal_fsync_duration_seconds_count m1)" \
  "$(metric cairn_core_idle_polls_total m0)" "$(metric cairn_core_idle_polls_total m1)" \
  "$DIR/s0" "$DIR/s1" "$W $*" <<'PY'
import sys
n, t0, t1, hz, p0, p1, f0, f1, i0, i1 = map(float, sys.argv[1:11])
def per_thread(path):
    with open(path) as f:
        return {tid: (int(v), int(i)) for tid, v, i in (line.split() for line in f)}
before, after = per_thread(sys.argv[11]), per_thread(sys.argv[12])
vol = sum(v - before.get(tid, (0, 0))[0] for tid, (v, _) in after.items())
invol = sum(i - before.get(tid, (0, 0))[1] for tid, (_, i) in after.items())
exited = len(before.keys() - after.keys())
cpu_us = (t1 - t0) / hz * 1e6 / n
poll_us = (p1 - p0) * 1e6 / n
print(f"{sys.argv[13]}: {n / 5:.0f} req/s, CPU {cpu_us:.1f} us/op "
      f"(idle polling {poll_us:.1f}, the rest {cpu_us - poll_us:.1f}), "
      f"WAL flushes {f1 - f0:.0f}, idle polls {i1 - i0:.0f}, "
      f"context switches per op {vol / n:.3f} voluntary, {invol / n:.3f} involuntary "
      f"({exited} threads exited meanwhile, not counted)")
PY
