# Shared by the scripts beside it that start three members on 127.0.0.1
# (client ports 12379, 22379 and 32379). Source it; it runs nothing.

# leader_of PATTERN SECONDS: prints the digit (1, 2 or 3) of the member whose
# /metrics has a line matching the extended regex PATTERN, asking every 0.1 s
# for at most SECONDS; prints nothing if none does by then.
leader_of() {
  local pattern=$1 seconds=$2 p
  for _ in $(seq $((seconds * 10))); do
    for p in 1 2 3; do
      if curl -sf "127.0.0.1:${p}2379/metrics" 2>/dev/null | grep -Eq "$pattern"; then
        echo "$p"
        return
      fi
    done
    sleep 0.1
  done
}
