#!/bin/bash
# A put's time by stage on a 3-member cluster: put-1 against the leader, and
# the members' stage histograms over each run.
#
#   bench/scripts/put-stages.sh CAIRN_BIN ROUNDS [member flags...]
#
# Starts three members of CAIRN_BIN on 127.0.0.1 (client ports 12379, 22379
# and 32379, peer ports 12380, 22380 and 32380) with fresh data directories
# and the given flags, finds shard 0's leader, puts for 2 s to warm up, then
# runs ROUNDS rounds of 10 s of put-1 (one client, one connection, 8 B keys,
# 256 B values over 100,000 keys) against the leader. For each round it prints
# the client's figures and, per member, the count, mean and quantiles of
# the observations between scrapes of /metrics before and after the round:
# the KV call, the proposal to its apply, a WAL group flush, a store
# commit and each step of one (README, "Where a write's time goes"). Quantiles are interpolated
# within histogram buckets, so they are as coarse as the buckets (from 50 µs
# for the first four, from 10 µs for the steps). The members'
# logs are kept in $CAIRN_STAGES_LOGS (default /var/tmp/put-stages-logs).
# CAIRN_BENCH overrides the load generator (default target/release/cairn-bench).
set -euo pipefail
BIN=$1; ROUNDS=$2; shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=${CAIRN_BENCH:-target/release/cairn-bench}
LOGS=${CAIRN_STAGES_LOGS:-/var/tmp/put-stages-logs}
DIR=$(mktemp -d /var/tmp/put-stages.XXXXXX)
CLUSTER=a=http://127.0.0.1:12380,b=http://127.0.0.1:22380,c=http://127.0.0.1:32380
pids=()
finish() {
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  mkdir -p "$LOGS" && cp "$DIR"/*.log "$LOGS"/ 2>/dev/null || true
  rm -rf "$DIR"
}
trap finish EXIT
for m in a:1 b:2 c:3; do
  n=${m%%:*}; p=${m##*:}
  "$BIN" --name "$n" --data-dir "$DIR/$n" \
    --listen-client-urls "http://127.0.0.1:${p}2379" --advertise-client-urls "http://127.0.0.1:${p}2379" \
    --listen-peer-urls "http://127.0.0.1:${p}2380" --initial-advertise-peer-urls "http://127.0.0.1:${p}2380" \
    --initial-cluster "$CLUSTER" --initial-cluster-token put-stages "$@" > "$DIR/$n.log" 2>&1 &
  pids+=($!)
done
# shellcheck source=members.sh
. "$HERE/members.sh"
leader=$(leader_of '^cairn_shard_is_leader\{[^}]*shard="0"[^}]*\} 1' 30)
[ -n "$leader" ] || { echo "no leader of shard 0 after 30 s; logs in $LOGS" >&2; exit 1; }
echo "leader: member on 127.0.0.1:${leader}2379"
PUT="put --key-size 8 --val-size 256 --key-space-size 100000"
"$BENCH" --endpoints "http://127.0.0.1:${leader}2379" --conns 1 --clients 1 --duration 2s --warmup 0s $PUT > /dev/null
STAGES="cairn_core_kv_request_duration_seconds cairn_shard_proposal_duration_seconds
  cairn_core_wal_flush_duration_seconds cairn_shard_store_commit_duration_seconds
  cairn_shard_backend_commit_step_duration_seconds"
for round in $(seq "$ROUNDS"); do
  for p in 1 2 3; do curl -sf "127.0.0.1:${p}2379/metrics" > "$DIR/before.$p"; done
  echo "round $round:"
  "$BENCH" --endpoints "http://127.0.0.1:${leader}2379" --conns 1 --clients 1 --duration 10s --warmup 0s $PUT \
    | grep -E '^\| (requests/s|p50|p90|p99|p99\.9) \|' | sed 's/^/  client /'
  for p in 1 2 3; do
    curl -sf "127.0.0.1:${p}2379/metrics" > "$DIR/after.$p"
    role=follower; [ "$p" = "$leader" ] && role=leader
    echo "  member on 127.0.0.1:${p}2379 ($role):"
    # shellcheck disable=SC2086
    python3 "$HERE/histogram-quantiles.py" "$DIR/before.$p" "$DIR/after.$p" $STAGES | sed 's/^/    /'
  done
done
