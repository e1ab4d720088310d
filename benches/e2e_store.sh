#!/usr/bin/env bash
# End-to-end cost of a shared limit on loopback (127.0.0.1 only): the same limits
#   (l) local, in the process,
#   (x) shared, exact: in a redis-server this script starts on a free port (`store: shared`,
#       `lease: off`: one script call per decision), and
#   (s) shared, leased: the same store with `lease: auto` (the default): the hot key takes
#       slices of quota and admits from them with no call (docs/fleet.md, "Leases"),
# each in a tollgate of its own in front of the same nginx upstream answering `200 ok`.
# The limits are out of reach (nothing is rejected), so every request makes one decision
# per limit; all requests share one key (the client address): one hot key.
#
# Load: wrk, E2E_CONNECTIONS connections, E2E_ROUNDS rounds alternating l -> x -> s. Per
# run: requests/s, p50 and p99 latency, tollgate's CPU per request (utime + stime from
# /proc/PID/stat) and, for (x) and (s), Redis's CPU per request (INFO cpu), the share of
# decisions its fallback made (missed budget) and the store calls per request
# (tollgate_store_requests_total sent to Redis, lease calls included, over requests served).
# Prints medians and, against local: exact's added CPU and latency and its calls per request
# (more than one per limit is flagged), and leased's ratios against the targets (store calls
# per request <= 0.01, tollgate + Redis CPU per request <= 1.05x, added p50 <= 20 µs,
# throughput >= 0.95x).
#
# E2E_LIMITS=N gives each proxy N token buckets, and E2E_RATE=1 one rate limit besides (all
# local, or all in the store) in the one request phase; E2E_COLD=1 keys them by a header wrk
# sets anew on every request (a cold key each time: no lease, one script per limit). Their
# script calls leave together (one pipeline, one round trip per phase), so the added p50
# with three should be about one RTT, as with one, not three: compare `E2E_LIMITS=1
# E2E_COLD=1` with `E2E_LIMITS=3 E2E_COLD=1`.
#
# Then a frozen round (f): the script's redis-server is stopped (SIGSTOP: the connection
# stays open and nothing answers, the worst case for a budget), wrk runs against (x) once
# more for E2E_DURATION, and the server is continued (SIGCONT). Prints the added p50/p99
# of (f) over (l) and PASS/MISS against the store budget + 1 ms (target: a frozen store
# adds at most its budget + 1 ms at p99: the first calls wait out the budget, the breaker
# then opens and decisions fall back at once), and how long the store took to be up again.
# The machine is shared and noisy: compare figures of one run only.
#
# Run:     benches/e2e_store.sh                 (release build; about two minutes after it)
# Leases:  E2E_RATE=1 benches/e2e_store.sh     (the issue's pair: a token bucket and a rate)
# Quick:   E2E_DURATION=2 E2E_ROUNDS=1 TOLLGATE_BIN=target/debug/tollgate benches/e2e_store.sh
# Knobs:   E2E_DURATION (s, 10)  E2E_ROUNDS (3)  E2E_WORKERS (2)  E2E_CONNECTIONS (16)
#          E2E_WARMUP (s, 1)  E2E_STORE_TIMEOUT (5ms)  E2E_LIMITS (1)  E2E_RATE (0)
#          E2E_COLD (0)  TOLLGATE_BIN (skip the cargo build)
# Needs:   wrk, nginx, redis-server, redis-cli (scripts/deps.sh installs them), cargo.
# Exit:    non-zero when a proxy failed to serve (no requests, over 1% non-2xx or socket
#          errors, frozen round included) or the shared limits never reached Redis.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
duration=${E2E_DURATION:-10}
rounds=${E2E_ROUNDS:-3}
workers=${E2E_WORKERS:-2}
conns=${E2E_CONNECTIONS:-16}
warmup=${E2E_WARMUP:-1}
store_timeout=${E2E_STORE_TIMEOUT:-5ms}
nlimits=${E2E_LIMITS:-1}
cold=${E2E_COLD:-0}
rate=${E2E_RATE:-0}
host=bench.local

log() { printf 'e2e-store: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

"$root/scripts/deps.sh" wrk nginx redis-server

if [[ -n ${TOLLGATE_BIN:-} ]]; then
  bin=$TOLLGATE_BIN
else
  log "cargo build --release --bin tollgate"
  (cd "$root" && cargo build --release --quiet --bin tollgate)
  bin=$root/target/release/tollgate
fi
[[ -x $bin ]] || die "no tollgate binary at $bin"

# free_port, cpu_ticks, http_get (`Connection: close`: the metrics listener keeps an
# HTTP/1.0 connection open without it) and wrk_summary; the cleanup below replaces lib.sh's
# (it continues a stopped redis-server before stopping it).
# shellcheck source=benches/lib.sh
source "$root/benches/lib.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-e2e-store.XXXXXX")
pids=()

# Stops what this script started (TERM, then KILL after 5 s), by PID only.
cleanup() {
  local status=$? pid waited alive
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do
    kill -CONT "$pid" 2>/dev/null || true # a stopped process acts on TERM once continued
    kill -TERM "$pid" 2>/dev/null || true
  done
  for ((waited = 0; waited < 50; waited++)); do
    alive=0
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null && alive=1
    done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$tmp"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Waits (20 s at most) until GET / on 127.0.0.1:$1 answers 2xx while PID $2 runs (lib.sh's
# wait_ready takes the PID first and reads the status only; this one is port-first).
wait_answers() {
  local tries
  for ((tries = 0; tries < 200; tries++)); do
    kill -0 "$2" 2>/dev/null || die "$3 exited at start: $(tail -n 20 "$tmp/$3.log" 2>/dev/null)"
    [[ $(http_get "$1" / "$host" 2>/dev/null | head -n 1) == *" 2"[0-9][0-9]* ]] && return
    sleep 0.1
  done
  die "$3 did not answer 2xx on port $1 within 20 s: $(tail -n 20 "$tmp/$3.log" 2>/dev/null)"
}

# A sample of tollgate's metrics at port $1 (series prefix $2), summed.
metric() {
  http_get "$1" /metrics | awk -v s="$2" 'index($0, s) == 1 { t += $NF } END { print t + 0 }'
}

# Calls tollgate at metrics port $1 sent to the store "shared" (every result of
# tollgate_store_requests_total but breaker_open, which never reaches Redis).
store_calls() {
  http_get "$1" /metrics | awk 'index($0, "tollgate_store_requests_total{") == 1 &&
    index($0, "store=\"shared\"") && !index($0, "result=\"breaker_open\"") { t += $NF }
    END { print t + 0 }'
}

# A duration (100us, 5ms, 1s) in µs.
duration_us() {
  awk -v d="$1" 'BEGIN {
    if (d ~ /us$/) print d + 0; else if (d ~ /ms$/) print (d + 0) * 1000
    else if (d ~ /s$/) print (d + 0) * 1000000; else print d + 0 }'
}

# ---------------------------------------------------------------------------------------
# Start everything.

up_port="" redis_port="" p="" m="" # set by free_port
free_port up_port
mkdir -p "$tmp/nginx/logs"
cat >"$tmp/nginx/nginx.conf" <<EOF
worker_processes 1;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $tmp/nginx/body; proxy_temp_path $tmp/nginx/proxy;
    fastcgi_temp_path $tmp/nginx/fastcgi; uwsgi_temp_path $tmp/nginx/uwsgi; scgi_temp_path $tmp/nginx/scgi;
    server { listen 127.0.0.1:$up_port backlog=4096; location / { return 200 "ok\n"; } }
}
EOF
nginx -p "$tmp/nginx" -e "$tmp/nginx/logs/error.log" -c "$tmp/nginx/nginx.conf" -g 'daemon off;' \
  >"$tmp/upstream.log" 2>&1 &
pids+=("$!")

free_port redis_port
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$tmp" --logfile "$tmp/redis.log" >/dev/null 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
for ((i = 0; i < 100; i++)); do
  redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$redis_port" ping >/dev/null 2>&1 || die "redis-server did not start"

key="[client_ip]" customer=""
wrk_script=()
if [[ $cold == 1 ]]; then
  key="[customer]" customer="  trusted_proxies: [\"127.0.0.1/32\"]
  customer_header: x-key"
  # A new key per request: this connection's counter, prefixed by a per-thread random.
  cat >"$tmp/cold.lua" <<'EOF'
local n, tag = 0, tostring(math.random(1, 1e9))
request = function()
  n = n + 1
  return wrk.format(nil, nil, { ["x-key"] = tag .. "-" .. n })
end
EOF
  wrk_script=(-s "$tmp/cold.lua")
fi

declare -A port pid metrics
variants=(l x s)
for v in "${variants[@]}"; do
  free_port p
  free_port m
  port[$v]=$p metrics[$v]=$m
  store=""
  [[ $v == x ]] && store="store: shared, lease: off, "
  [[ $v == s ]] && store="store: shared, "
  cat >"$tmp/$v.yaml" <<EOF
server:
  listen: ["127.0.0.1:$p"]
  metrics: "127.0.0.1:$m"
  threads: $workers
  grace_period: 0s
$customer
stores:
  shared: { kind: redis, url: "redis://127.0.0.1:$redis_port/0", timeout: $store_timeout }
origins:
  bench:
    hosts: ["$host"]
    upstreams: ["127.0.0.1:$up_port"]
    limits:
EOF
  for ((i = 0; i < nlimits; i++)); do
    echo "      tokens$i: { kind: token_bucket, key: $key, ${store}capacity: 1000000000, refill: { amount: 1000000000, every: 1s } }" >>"$tmp/$v.yaml"
  done
  if [[ $rate == 1 ]]; then
    echo "      hits: { kind: rate, key: $key, ${store}max: 1000000000, per: 1s }" >>"$tmp/$v.yaml"
  fi
  RUST_LOG=warn "$bin" run --config "$tmp/$v.yaml" --upgrade-sock "$tmp/$v.sock" \
    --pid-file "$tmp/$v.pid" >"$tmp/tollgate-$v.log" 2>&1 &
  pid[$v]=$!
  pids+=("${pid[$v]}")
done
for v in "${variants[@]}"; do
  wait_answers "${port[$v]}" "${pid[$v]}" "tollgate-$v"
done
for v in x s; do
  for ((i = 0; i < 100; i++)); do
    [[ $(metric "${metrics[$v]}" 'tollgate_store_up{store="shared"}') == 1 ]] && break
    sleep 0.1
  done
  [[ $(metric "${metrics[$v]}" 'tollgate_store_up{store="shared"}') == 1 ]] || die "the store never came up in tollgate-$v"
done
log "upstream :$up_port, redis :$redis_port, tollgate local :${port[l]}, exact :${port[x]}, leased :${port[s]}"

redis_cpu() {
  redis-cli -p "$redis_port" info cpu | tr -d '\r' |
    awk -F: '/^used_cpu_(user|sys):/ { t += $2 } END { printf "%.6f\n", t }'
}

clk_tck=$(getconf CLK_TCK)
results=$tmp/results.tsv
failed=0

# wrk for $2 s against proxy $1; with $3 = record, appends to the results:
#   label round rps p50 p99 cpu req bad rcpu fb calls
# label is $5 (default $1); with $6 = frozen, Redis is stopped and not asked for its CPU.
run_wrk() {
  local v=$1 secs=$2 mode=$3 round=${4:-0} label=${5:-$1} frozen=${6:-} before after out
  local rb=0 ra=0 fb0 fb1 c0 c1
  before=$(cpu_ticks "${pid[$v]}")
  [[ -n $frozen ]] || rb=$(redis_cpu)
  fb0=$(metric "${metrics[$v]}" 'tollgate_store_fallback_decisions_total')
  c0=$(store_calls "${metrics[$v]}")
  out=$(wrk --latency -t 1 -c "$conns" -d "${secs}s" -H "Host: $host" "${wrk_script[@]}" \
    "http://127.0.0.1:${port[$v]}/" 2>&1) || die "wrk failed against $v: $out"
  after=$(cpu_ticks "${pid[$v]}")
  [[ -n $frozen ]] || ra=$(redis_cpu)
  fb1=$(metric "${metrics[$v]}" 'tollgate_store_fallback_decisions_total')
  c1=$(store_calls "${metrics[$v]}")
  [[ $mode == record ]] || return 0
  local rps p50 p99 req bad
  IFS=$'\t' read -r rps p50 p99 req bad < <(wrk_summary "$out")
  awk -v v="$label" -v round="$round" -v ticks=$((after - before)) -v hz="$clk_tck" \
    -v rcpu="$(awk -v a="$ra" -v b="$rb" 'BEGIN { print a - b }')" -v fb=$((fb1 - fb0)) \
    -v calls=$((c1 - c0)) -v rps="$rps" -v p50="$p50" -v p99="$p99" -v req="$req" -v bad="$bad" 'BEGIN {
      cpu = req > 0 ? ticks * 1000000 / hz / req : 0
      rc = req > 0 ? rcpu * 1000000 / req : 0
      printf "%s\t%d\t%.0f\t%.0f\t%.0f\t%.2f\t%d\t%d\t%.2f\t%d\t%d\n", v, round, rps, p50, p99, cpu, req, bad, rc, fb, calls
    }' >>"$results"
}

for v in "${variants[@]}"; do
  run_wrk "$v" "$warmup" warmup
done
for ((r = 1; r <= rounds; r++)); do
  for v in "${variants[@]}"; do
    run_wrk "$v" "$duration" record "$r"
    IFS=$'\t' read -r _ _ rps p50 p99 cpu req bad rc fb calls < <(tail -n 1 "$results")
    log "round $r/$rounds $v: $rps req/s, p50 $p50 µs, p99 $p99 µs, tollgate CPU $cpu µs/req, redis CPU $rc µs/req, $req requests, $bad bad, $fb by fallback, $calls store calls"
    if ((req == 0 || bad * 100 > req)); then
      log "FAIL: $v served $req requests with $bad non-2xx or socket errors"
      failed=1
    fi
  done
done

# The frozen round: Redis stopped (not killed) under the same load against (x), the exact
# path (a leased proxy would keep admitting from its slices for a while).
log "frozen round: SIGSTOP redis-server (pid $redis_pid), wrk ${duration}s against the exact shared proxy"
kill -STOP "$redis_pid"
run_wrk x "$duration" record 1 f frozen
kill -CONT "$redis_pid"
continued=$(date +%s%N)
IFS=$'\t' read -r _ _ rps p50 p99 cpu req bad rc fb calls < <(tail -n 1 "$results")
log "frozen: $rps req/s, p50 $p50 µs, p99 $p99 µs, tollgate CPU $cpu µs/req, $req requests, $bad bad, $fb by fallback, $calls store calls"
if ((req == 0 || bad * 100 > req)); then
  log "FAIL: the shared proxy served $req requests with $bad non-2xx or socket errors while Redis was frozen"
  failed=1
fi
back=""
for ((i = 0; i < 200; i++)); do
  if [[ $(metric "${metrics[x]}" 'tollgate_store_up{store="shared"}') == 1 ]]; then
    back=$((($(date +%s%N) - continued) / 1000000))
    break
  fi
  sleep 0.05
done
if [[ -n $back ]]; then
  log "store up again ${back} ms after SIGCONT"
else
  log "FAIL: the store was not up again within 10 s of SIGCONT"
  failed=1
fi

for v in x s; do
  ok=$(metric "${metrics[$v]}" 'tollgate_store_requests_total{result="ok"')
  log "tollgate-$v: store calls answered: $ok"
  ((ok > 0)) || {
    log "FAIL: tollgate-$v's shared limits never reached Redis"
    failed=1
  }
done

kinds="$nlimits token bucket(s)"
((rate == 1)) && kinds+=" + a rate"
echo
echo "## Shared vs local: $kinds per request, cold keys: $cold; wrk -t1 -c$conns, ${duration}s x $rounds rounds, $workers workers, loopback, budget $store_timeout"
echo
echo "CPU µs/req = tollgate utime+stime / requests; Redis µs/req = INFO used_cpu_user+sys / requests."
echo "Exact: lease: off (one script call per decision). Leased: lease: auto (the hot key admits from slices)."
echo "Frozen: one ${duration}s round against the exact proxy with redis-server stopped (SIGSTOP)."
echo
awk -F'\t' -v budget="$(duration_us "$store_timeout")" -v back="${back:-none}" -v nl="$((nlimits + rate))" -v cold="$cold" '
  function median(v, k,    a, n, i, j, t) {
    n = split(vals[v, k], a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  {
    for (k = 3; k <= 11; k++) vals[$1, k] = vals[$1, k] (vals[$1, k] == "" ? "" : " ") $k
    req[$1] += $7; calls[$1] += $11
  }
  END {
    name["l"] = "local"; name["x"] = "shared, exact (lease: off)"; name["s"] = "shared, leased (lease: auto)"
    name["f"] = "shared, exact, Redis frozen"
    print "| limits | req/s | p50 µs | p99 µs | tollgate CPU µs/req | Redis CPU µs/req | requests | by fallback | store calls | calls/req |"
    print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    split("l x s f", order, " ")
    for (i = 1; i <= 4; i++) {
      v = order[i]
      cr = req[v] > 0 ? calls[v] / req[v] : 0
      printf "| %s | %.0f | %.0f | %.0f | %.2f | %.2f | %.0f | %.0f | %.0f | %.4f |\n", name[v], median(v, 3), median(v, 4), median(v, 5), median(v, 6), median(v, 9), median(v, 7), median(v, 10), median(v, 11), cr
    }
    print ""
    # Exact against local: what a round trip per phase costs.
    dc = median("x", 6) - median("l", 6)
    printf "- exact: added tollgate CPU per request %.2f µs, Redis %.2f µs per request; added latency p50 %+.0f µs, p99 %+.0f µs\n", dc, median("x", 9), median("x", 4) - median("l", 4), median("x", 5) - median("l", 5)
    cpr = req["x"] > 0 ? calls["x"] / req["x"] : 0
    # wrk counts the responses it got in time: the requests still in flight when a round
    # ends (at most one per connection) made their call without being counted, so a few
    # more calls than requests is not a second call.
    printf "- exact: store calls per request %.4f (%d calls / %d requests, %d limits)%s\n", cpr, calls["x"], req["x"], nl, (cpr > nl * 1.001 ? " FLAG: more than one call per limit per request" : "")
    # Leased against local: the targets (hot key only: a cold key is never leased, so the
    # leased proxy decides it as the exact one does).
    lc = req["s"] > 0 ? calls["s"] / req["s"] : 0
    if (cold == 1) {
      printf "- leased, cold keys (never leased): store calls per request %.4f, added p50 %+.0f µs\n", lc, median("s", 4) - median("l", 4)
    } else {
      tl = median("l", 6) + median("l", 9); ts = median("s", 6) + median("s", 9)
      cpu = tl > 0 ? ts / tl : 0
      dp = median("s", 4) - median("l", 4)
      tp = median("l", 3) > 0 ? median("s", 3) / median("l", 3) : 0
      printf "- leased: store calls per request %.4f (%s: target <= 0.01)\n", lc, (lc <= 0.01 ? "PASS" : "MISS")
      printf "- leased: tollgate + Redis CPU per request %.2f / %.2f µs = %.3fx local (%s: target <= 1.05x)\n", ts, tl, cpu, (cpu <= 1.05 ? "PASS" : "MISS")
      printf "- leased: added p50 %+.0f µs (%s: target <= 20 µs), p99 %+.0f µs\n", dp, (dp <= 20 ? "PASS" : "MISS"), median("s", 5) - median("l", 5)
      printf "- leased: throughput %.3fx local (%s: target >= 0.95x)\n", tp, (tp >= 0.95 ? "PASS" : "MISS")
    }
    fp50 = median("f", 4) - median("l", 4); fp99 = median("f", 5) - median("l", 5)
    printf "- Redis frozen, added latency over local: p50 %+.0f µs, p99 %+.0f µs (%s: target p99 <= budget %.0f µs + 1 ms)\n", fp50, fp99, (fp99 <= budget + 1000 ? "PASS" : "MISS"), budget
    printf "- Redis frozen: %.0f of %.0f decisions by fallback, %.0f calls sent to Redis; store up again %s ms after SIGCONT\n", median("f", 10), median("f", 7), median("f", 11), back
  }' "$results"

if ((failed)); then
  exit 1
fi
