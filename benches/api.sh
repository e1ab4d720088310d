#!/usr/bin/env bash
# The limiter API against Redis itself, on loopback (127.0.0.1 only), in one run:
#   (a) RL.REDUCE on tollgate's limiter API: the real binary (release), `server.limiter_api`
#       with its one API thread, buckets in the local store (the default `api.store`);
#   (b) INCR on a real redis-server (the cheapest write Redis does), and
#   (c) EVALSHA of the same token-bucket algorithm as a Lua script on that redis-server
#       (what a Redis-backed limiter costs: HMGET, arithmetic, HSET, PEXPIRE, TIME);
#   and, for information, CH.REQUEST on a local token_bucket resource (no target).
# Each server runs on one core (taskset -c 0, when taskset exists) and redis-benchmark on
# the other (taskset -c 1), so requests/s is per core. Keys are random over 100 000
# (`-r 100000`, `k:__rand_int__`), with buckets big enough that every take succeeds.
# Pipeline depths: -P 1 and -P 16, 50 connections. Per run: requests/s, and each server's
# CPU time per request (utime + stime from /proc/PID/stat, before and after; tollgate's
# proxy threads sit idle meanwhile).
#
# Targets: RL.REDUCE >= EVALSHA, and >= INCR / 2, at each depth (reported, not enforced).
# The machine is shared and noisy: compare the ratios of one run, not figures across runs.
# When other work competes for the cores, requests/s at -P 1 measures scheduling delays more
# than servers; the ratios of CPU time per request ("per CPU-second") say what each server
# would serve per core, and are printed too.
#
# Run:     nice benches/api.sh
# Knobs:   API_BENCH_N1 (requests at -P 1, 200000)  API_BENCH_N16 (at -P 16, 1000000)
#          API_BENCH_CLIENTS (50)  API_BENCH_KEYS (100000)
# Needs:   redis-server, redis-benchmark, redis-cli (scripts/deps.sh installs them), cargo.
# Exit:    non-zero when a server failed to answer correctly or a run served nothing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
n1=${API_BENCH_N1:-200000}
n16=${API_BENCH_N16:-1000000}
clients=${API_BENCH_CLIENTS:-50}
keys=${API_BENCH_KEYS:-100000}

log() { printf 'api-bench: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

"$root/scripts/deps.sh" redis-server redis-cli redis-benchmark

log "cargo build --release --bin tollgate"
(cd "$root" && cargo build --release --quiet --bin tollgate)
api_bin=$root/target/release/tollgate
[[ -x $api_bin ]] || die "no tollgate binary at $api_bin"

server_cpu=()
client_cpu=()
if command -v taskset >/dev/null 2>&1 && (($(nproc) >= 2)); then
  server_cpu=(taskset -c 0)
  client_cpu=(taskset -c 1)
else
  log "taskset or a second core missing: processes are not pinned"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-api-bench.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

# A free loopback port: bind port 0, read it, release it.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# tollgate with the limiter API (one thread), buckets for twice the key space, and a
# resource for CH.REQUEST; the proxy listens on loopback and is not used.
api_port=$(free_port)
cat >"$tmp/tollgate.yaml" <<EOF
server:
  listen: ["127.0.0.1:$(free_port)"]
  threads: 1
  grace_period: 0s
  limiter_api: "127.0.0.1:$api_port"
api:
  max_keys: $((2 * keys))
origins:
  bench:
    hosts: [bench.test]
    upstreams: ["127.0.0.1:9"]
resources:
  bench: { kind: token_bucket, capacity: 1000000000, refill: { amount: 1000000000, every: 60s }, max_keys: $((2 * keys)) }
EOF
RUST_LOG=warn "${server_cpu[@]}" "$api_bin" run --config "$tmp/tollgate.yaml" \
  --upgrade-sock "$tmp/upgrade.sock" --pid-file "$tmp/tollgate.pid" >"$tmp/api.out" 2>"$tmp/api.err" &
api_pid=$!
pids+=("$api_pid")
for _ in $(seq 100); do
  redis-cli -p "$api_port" PING >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$api_port" PING >/dev/null 2>&1 || die "the limiter API did not start: $(cat "$tmp/api.err")"

redis_port=$(free_port)
"${server_cpu[@]}" redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
  --daemonize no --dir "$tmp" --logfile "$tmp/redis.log" &
redis_pid=$!
pids+=("$redis_pid")
for _ in $(seq 100); do
  redis-cli -p "$redis_port" PING >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$redis_port" PING >/dev/null || die "redis-server did not start"

# The token bucket of RL.REDUCE, in Lua: KEYS[1], ARGV max refill_seconds amount take.
# Replies the tokens held before the take; Redis TIME is the clock.
script='
local max, every = tonumber(ARGV[1]), tonumber(ARGV[2]) * 1000000
local amount, take = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local s = redis.call("HMGET", KEYS[1], "t", "l")
local tokens, last = max, now
if s[1] then tokens, last = tonumber(s[1]), tonumber(s[2]) end
if now < last then now = last end
local n = math.floor((now - last) / every)
tokens = math.min(max, tokens + n * amount)
last = last + n * every
if tokens >= max then last = now end
local before = tokens
if tokens >= take then tokens = tokens - take end
if tokens >= max then
  redis.call("DEL", KEYS[1])
else
  redis.call("HSET", KEYS[1], "t", tokens, "l", last)
  local full = math.ceil((max - tokens) / amount) * every - (now - last)
  redis.call("PEXPIRE", KEYS[1], math.ceil(full / 1000) + 1)
end
return before'
sha=$(redis-cli -p "$redis_port" SCRIPT LOAD "$script")
[[ $sha =~ ^[0-9a-f]{40}$ ]] || die "SCRIPT LOAD failed: $sha"

# Same semantics, checked once: 2 per minute replies 2, 1, 0 on both.
check() {
  local got
  got=$(for _ in 1 2 3; do "$@"; done | tr '\n' ' ')
  [[ $got == "2 1 0 " ]] || die "$* replied '$got', expected '2 1 0'"
}
check redis-cli -p "$api_port" RL.REDUCE check 2 60
check redis-cli -p "$redis_port" EVALSHA "$sha" 1 check 2 60 2 1

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# run NAME PID PORT DEPTH REQUESTS COMMAND...: prints "NAME DEPTH rps cpu_us_per_request".
run() {
  local name=$1 pid=$2 port=$3 depth=$4 n=$5
  shift 5
  local before after out rps
  before=$(cpu_ticks "$pid")
  out=$("${client_cpu[@]}" redis-benchmark -h 127.0.0.1 -p "$port" -c "$clients" -n "$n" \
    -P "$depth" -r "$keys" --csv "$@" 2>&1) || die "redis-benchmark $name: $out"
  after=$(cpu_ticks "$pid")
  if grep -qi "error" <<<"$out"; then
    die "$name -P $depth: the server answered errors: $(grep -i error <<<"$out" | head -3)"
  fi
  rps=$(awk -F'","' '/^"/ && !/^"test"/ { rps = $2 + 0 } END { print rps }' <<<"$out")
  [[ -n $rps && $rps != 0 ]] || die "$name -P $depth served nothing: $out"
  awk -v name="$name" -v d="$depth" -v rps="$rps" -v t=$((after - before)) -v hz="$hz" -v n="$n" \
    'BEGIN { printf "%-10s %3d %12.0f %10.2f\n", name, d, rps, t / hz * 1e6 / n }'
}

results=$tmp/results
: >"$results"
for depth in 1 16; do
  n=$n1
  ((depth == 1)) || n=$n16
  log "-P $depth: $n requests each"
  run RL.REDUCE "$api_pid" "$api_port" "$depth" "$n" RL.REDUCE k:__rand_int__ 1000000000 60 >>"$results"
  run INCR "$redis_pid" "$redis_port" "$depth" "$n" INCR k:__rand_int__ >>"$results"
  run EVALSHA "$redis_pid" "$redis_port" "$depth" "$n" \
    EVALSHA "$sha" 1 e:__rand_int__ 1000000000 60 1000000000 1 >>"$results"
  run CH.REQUEST "$api_pid" "$api_port" "$depth" "$n" CH.REQUEST bench d:__rand_int__ 1 >>"$results"
done

printf '%-10s %3s %12s %10s\n' command P 'requests/s' 'cpu_us/req'
cat "$results"
echo
awk '
  { rps[$1, $2] = $3; cpu[$1, $2] = $4 }
  END {
    for (d = 1; d <= 16; d += 15) {
      r = rps["RL.REDUCE", d]; i = rps["INCR", d]; e = rps["EVALSHA", d]
      printf "-P %-2d requests/s:  RL.REDUCE / EVALSHA = %.2f (target >= 1: %s)   RL.REDUCE / INCR = %.2f (target >= 0.5: %s)\n",
        d, r / e, (r >= e ? "met" : "MISSED"), r / i, (r >= i / 2 ? "met" : "MISSED")
      r = cpu["RL.REDUCE", d]; i = cpu["INCR", d]; e = cpu["EVALSHA", d]
      printf "-P %-2d per CPU-second: RL.REDUCE / EVALSHA = %.2f   RL.REDUCE / INCR = %.2f\n", d, e / r, i / r
    }
  }' "$results"
