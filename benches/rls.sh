#!/usr/bin/env bash
# Envoy's rate limit service: ShouldRateLimit decisions per second and tollgate's CPU time
# per decision, with the rules in the local store and in a Redis store, on loopback.
# The client is Python's grpcio (tests/it/common/rls_client.py's bench mode: THREADS
# threads on one channel, one descriptor per call, a roomy limit so every call is OK);
# grpcio's Python side is the slower end, so decisions/s is the client's ceiling as much as
# tollgate's: compare the CPU time per decision, which only tollgate's work fills.
#
# Run:     nice benches/rls.sh [BINARY]        (default: cargo build --release, its binary)
# Knobs:   RLS_BENCH_SECONDS (10)  RLS_BENCH_THREADS (8)
# Needs:   redis-server, /usr/bin/python3 with grpcio and protobuf (scripts/deps.sh).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${RLS_BENCH_SECONDS:-10}
threads=${RLS_BENCH_THREADS:-8}
log() { printf 'rls-bench: %s\n' "$*" >&2; }

"$root/scripts/deps.sh" redis-server
bin=${1:-}
if [[ -z $bin ]]; then
  log "cargo build --release --bin tollgate"
  (cd "$root" && cargo build --release --quiet --bin tollgate)
  bin=$root/target/release/tollgate
fi

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-rls-bench.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

redis_port=$(port)
redis-server --port "$redis_port" --save '' --appendonly no --daemonize no >"$tmp/redis.log" 2>&1 &
pids+=($!)
mkdir -p "$tmp/rls"
cat >"$tmp/rls/bench.yaml" <<'EOF'
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 4000000000 }
EOF

# ticks: utime + stime of PID, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run() {
  local name=$1 store=$2
  local listen metrics rls
  listen=$(port) metrics=$(port) rls=$(port)
  cat >"$tmp/$name.yaml" <<EOF
server:
  listen: ["127.0.0.1:$listen"]
  metrics: "127.0.0.1:$metrics"
  rls: "127.0.0.1:$rls"
  grace_period: 0s
stores:
  fleet: { kind: redis, url: "redis://127.0.0.1:$redis_port/0", timeout: 50ms }
origins:
  app: { hosts: [app.test], upstreams: ["127.0.0.1:1"] }
rls:
  config_dir: rls
$store
EOF
  "$bin" run --config "$tmp/$name.yaml" >"$tmp/$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$rls") 2>/dev/null && break
    sleep 0.05
  done
  local before after out calls
  before=$(ticks "$pid")
  out=$(/usr/bin/python3 "$root/tests/it/common/rls_client.py" "127.0.0.1:$rls" \
    "[{\"bench\": {\"domain\": \"bench\", \"descriptors\": [[[\"user\", \"alice\"]]]}, \"seconds\": $seconds, \"threads\": $threads}]")
  after=$(ticks "$pid")
  calls=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['calls'])" "$out")
  python3 - "$name" "$out" "$((after - before))" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
name, out, ticks, hz = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cpu = ticks / hz
print(f"{name:6} {out['per_second']:10.0f} decisions/s  {out['calls']:8d} calls  "
      f"tollgate CPU {cpu:6.2f} s  = {1e6 * cpu / max(out['calls'], 1):7.1f} us/decision")
EOF
  kill "$pid"
  [[ $calls -gt 0 ]] || { log "$name served nothing"; exit 1; }
}

echo "ShouldRateLimit, $threads client threads, ${seconds}s each, binary $bin"
run local ""
run redis "  store: fleet"
