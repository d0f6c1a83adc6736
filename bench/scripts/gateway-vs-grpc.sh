#!/bin/bash
# Cairn (3 members) and etcd 3.4 (3 members) side by side: put over gRPC and over the HTTP/JSON gateway.
set -u
# Run from an empty scratch directory: members write their data and logs here.
# Build first: cargo build --release -p cairn -p cairn-bench
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=$ROOT/target/release/cairn-bench
C=$ROOT/target/release/cairn
CL=a=http://127.0.0.1:41380,b=http://127.0.0.1:42380,c=http://127.0.0.1:43380
EL=a=http://127.0.0.1:51380,b=http://127.0.0.1:52380,c=http://127.0.0.1:53380
for i in 1 2 3; do
  n=$(echo a b c | cut -d' ' -f$i)
  $C --name $n --data-dir c$n --listen-client-urls http://127.0.0.1:4${i}379 --advertise-client-urls http://127.0.0.1:4${i}379 \
    --listen-peer-urls http://127.0.0.1:4${i}380 --initial-advertise-peer-urls http://127.0.0.1:4${i}380 --initial-cluster $CL > c$n.log 2>&1 &
  etcd --name $n --data-dir e$n --listen-client-urls http://127.0.0.1:5${i}379 --advertise-client-urls http://127.0.0.1:5${i}379 \
    --listen-peer-urls http://127.0.0.1:5${i}380 --initial-advertise-peer-urls http://127.0.0.1:5${i}380 --initial-cluster $EL > e$n.log 2>&1 &
done
sleep 5
CE=127.0.0.1:41379,127.0.0.1:42379,127.0.0.1:43379
EE=127.0.0.1:51379,127.0.0.1:52379,127.0.0.1:53379
for round in 1 2 3; do
  for sys in cairn etcd; do
    if [ $sys = cairn ]; then EP=$CE; else EP=$EE; fi
    for mode in grpc gateway; do
      G=""; [ $mode = gateway ] && G="--gateway"
      out=$($B --endpoints $EP --conns 100 --clients 100 --duration 5s --warmup 1s --json put --key-space-size 1000 $G 2>&1 | tail -1)
      echo "round=$round sys=$sys mode=$mode $(echo "$out" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("rps=%.0f p50_ms=%s p99_ms=%s errors=%s" % (d.get("requests_per_sec", d.get("rps",0)), d.get("p50_ms"), d.get("p99_ms"), d.get("errors")))' 2>/dev/null || echo "$out")"
    done
  done
done
pkill -f "data-dir c[abc]"; pkill -f "etcd --name"
