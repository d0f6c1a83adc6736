#!/bin/bash
# Serializable ranges over every shard while other clients write, for one or
# more builds side by side: what a read's wait for its shards to reach the
# member's revision costs (docs/KEYSPACE.md, "Consistent reads").
#
#   bench/scripts/serializable-under-writes.sh ROUNDS BIN [BIN...]
#
# Each round runs every build in turn (the order reversed every other round):
# three members on 127.0.0.1 (client ports 12379, 22379 and 32379) with
# fresh data directories and `--shards 4` (a BIN named etcd is started
# without it, as etcd's one Raft group); then, against the leader,
# puts from 10 clients over 2 connections (8 B keys, 256 B values, 1,000
# keys) for 7 s, and from its second second on 5 s of serializable ranges
# of the keys 00000000 to 00000009 (every shard) from 50 clients over 5
# connections, measured after 1 s of warm-up. Prints both tables' rate and
# quantiles per build. CAIRN_BENCH overrides the load generator (default
# target/release/cairn-bench).
set -euo pipefail
ROUNDS=$1; shift
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=members.sh
. "$HERE/members.sh"
BENCH=${CAIRN_BENCH:-target/release/cairn-bench}
CLUSTER=a=http://127.0.0.1:12380,b=http://127.0.0.1:22380,c=http://127.0.0.1:32380
pids=()
DIR=""
stop() {
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  pids=()
  [ -n "$DIR" ] && rm -rf "$DIR"
  DIR=""
}
trap stop EXIT
one() {
  local bin=$1
  DIR=$(mktemp -d /var/tmp/serializable-writes.XXXXXX)
  local shards=(--shards 4) leads='^cairn_shard_is_leader\{[^}]*shard="3"[^}]*\} 1'
  if [ "$(basename "$bin")" = etcd ]; then
    shards=(); leads='^etcd_server_is_leader 1'
  fi
  for m in a:1 b:2 c:3; do
    local n=${m%%:*} p=${m##*:}
    "$bin" --name "$n" --data-dir "$DIR/$n" "${shards[@]}" \
      --listen-client-urls "http://127.0.0.1:${p}2379" --advertise-client-urls "http://127.0.0.1:${p}2379" \
      --listen-peer-urls "http://127.0.0.1:${p}2380" --initial-advertise-peer-urls "http://127.0.0.1:${p}2380" \
      --initial-cluster "$CLUSTER" --initial-cluster-token serializable-writes > "$DIR/$n.log" 2>&1 &
    pids+=($!)
  done
  local leader
  leader=$(leader_of "$leads" 60)
  [ -n "$leader" ] || { echo "no leader of every shard after 60 s" >&2; exit 1; }
  local ep="http://127.0.0.1:${leader}2379"
  # The ten keys the range reads, on every shard.
  "$BENCH" --endpoints "$ep" --total 10 --warmup 0s put --key-size 8 --val-size 256 \
    --key-space-size 10 --sequential-keys > /dev/null
  "$BENCH" --endpoints "$ep" --conns 2 --clients 10 --duration 7s --warmup 0s \
    put --key-size 8 --val-size 256 --key-space-size 1000 > "$DIR/put.out" &
  local writer=$!
  sleep 1
  "$BENCH" --endpoints "$ep" --conns 5 --clients 50 --duration 5s --warmup 1s \
    range 00000000 00000010 --consistency s > "$DIR/range.out"
  wait "$writer"
  echo "$bin:"
  grep -E '^\| (requests/s|p50|p99|p99\.9) \|' "$DIR/range.out" | sed 's/^/  range /'
  grep -E '^\| (requests/s|p50|p99) \|' "$DIR/put.out" | sed 's/^/  put   /'
  stop
}
for round in $(seq "$ROUNDS"); do
  echo "round $round"
  bins=("$@")
  if [ $((round % 2)) -eq 0 ]; then
    reversed=(); for ((i=${#bins[@]}-1; i>=0; i--)); do reversed+=("${bins[i]}"); done; bins=("${reversed[@]}")
  fi
  for bin in "${bins[@]}"; do one "$bin"; done
done
