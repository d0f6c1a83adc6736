#!/bin/bash
# put-1 (one client writing one key at a time to a 3-member cluster) beside
# the floor the disk under the members sets for it, in alternating rounds.
#
#   bench/scripts/put-1-floor.sh ROUNDS [WORK_DIR]
#
# Each round runs `cairn-bench compare --runs 1 --workloads put-1` (etcd and
# Cairn, three members each, data in WORK_DIR, default /var/tmp/bench) and
# then `cairn-tune replicas --members 3 --rounds 1` in WORK_DIR: three threads
# appending 4 KiB O_DIRECT RWF_DSYNC blocks through io_uring to their own
# files on the same disk, a write counting once two of them have it durable,
# with nothing else around the appends (tuning/README.md, "replicas"). It prints each round's
# p50 and p99 of the three and the medians over the rounds, with a third of
# etcd's p99 (the put-1 target) beside the floor's p99.
# CAIRN_BENCH and CAIRN_TUNE override the binaries (default target/release/).
set -euo pipefail
ROUNDS=$1; WORK=${2:-/var/tmp/bench}
BENCH=${CAIRN_BENCH:-target/release/cairn-bench}
TUNE=${CAIRN_TUNE:-target/release/cairn-tune}
mkdir -p "$WORK"
OUT=$(mktemp /var/tmp/put-1-floor.XXXXXX)
trap 'rm -f "$OUT"' EXIT
for round in $(seq "$ROUNDS"); do
  "$BENCH" --duration 5s --warmup 1s compare --runs 1 --workloads put-1 --work-dir "$WORK" \
    | grep '^{"compare"' >> "$OUT"
  "$TUNE" replicas --dir "$WORK" --members 3 --secs 5 --rounds 1 --json | tail -n 1 >> "$OUT"
  echo "round $round of $ROUNDS done" >&2
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = []
lines = [json.loads(l) for l in open(sys.argv[1])]
for cmp, floor in zip(lines[0::2], lines[1::2]):
    put = next(w for w in cmp["compare"] if w["workload"] == "put-1")["results"]
    three = floor["replicated"]
    rows.append({
        "etcd p50": put["etcd"]["p50_ms"] * 1000, "etcd p99": put["etcd"]["p99_ms"] * 1000,
        "Cairn p50": put["cairn"]["p50_ms"] * 1000, "Cairn p99": put["cairn"]["p99_ms"] * 1000,
        "floor p50": three["p50_us"], "floor p99": three["p99_us"],
        "etcd p99 / 3": put["etcd"]["p99_ms"] * 1000 / 3,
    })
cols = list(rows[0])
print("| round | " + " | ".join(c + " µs" for c in cols) + " |")
print("|---:|" + "---:|" * len(cols))
for i, r in enumerate(rows, 1):
    print(f"| {i} | " + " | ".join(f"{r[c]:.0f}" for c in cols) + " |")
print("| median | " + " | ".join(f"{statistics.median(r[c] for r in rows):.0f}" for c in cols) + " |")
PY
