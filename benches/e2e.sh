#!/usr/bin/env bash
# End-to-end load comparison on loopback (127.0.0.1 only): what a request costs through
#   (p) bare Pingora (examples/bare_pingora: same Pingora, allocator and profile, no logic),
#   (a) tollgate with no limits,
#   (b) tollgate with an inflight, a rate and a token-bucket limit on every request (set high
#       enough that nothing is rejected), and
#   (c) nginx as a reverse proxy with limit_req and limit_conn (high limits),
# all in front of the same nginx upstream answering `200 ok`, all with the same worker count.
#
# Load: wrk, 32 connections, Host: bench.local, E2E_ROUNDS rounds cycling p -> a -> b -> c. Per
# run: requests/s, p50 and p99 latency (wrk --latency), and the proxy's CPU time per request
# (utime + stime from /proc/PID/stat of the proxy process, plus its worker processes for
# nginx, read before and after the run, divided by the requests served). It prints the
# medians over rounds and the ratios tollgate-with-limits / tollgate-without and
# tollgate / nginx (CPU per request). The machine is shared and noisy: compare the ratios of
# one run, not absolute figures across runs.
#
# Run:     benches/e2e.sh                              (defaults: about 2 minutes after the build)
# CI:      E2E_DURATION=1 E2E_ROUNDS=1 benches/e2e.sh
# Knobs:   E2E_DURATION (s, 10)  E2E_ROUNDS (3)  E2E_WORKERS (2)  E2E_CONNECTIONS (32)
#          E2E_WRK_THREADS (1)   E2E_WARMUP (s, 1)  TOLLGATE_BIN (skip the cargo build)
# Needs:   wrk and nginx (installed through scripts/deps.sh when missing), cargo.
# Exit:    non-zero when a proxy failed to serve (no requests, or over 1% non-2xx/3xx or
#          socket errors); a missed budget is reported, not an error.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
duration=${E2E_DURATION:-10}
rounds=${E2E_ROUNDS:-3}
workers=${E2E_WORKERS:-2}
conns=${E2E_CONNECTIONS:-32}
wrk_threads=${E2E_WRK_THREADS:-1}
warmup=${E2E_WARMUP:-1}
host=bench.local

log() { printf 'e2e: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

"$root/scripts/deps.sh" wrk nginx

if [[ -n ${TOLLGATE_BIN:-} ]]; then
  bin=$TOLLGATE_BIN
  bare=$(dirname "$bin")/examples/bare_pingora
  [[ -x $bare ]] || (cd "$root" && cargo build --quiet --example bare_pingora)
else
  log "cargo build --release (tollgate and examples/bare_pingora)"
  (cd "$root" && cargo build --release --quiet --bin tollgate --example bare_pingora)
  bin=$root/target/release/tollgate
  bare=$root/target/release/examples/bare_pingora
fi
[[ -x $bin ]] || die "no tollgate binary at $bin"
[[ -x $bare ]] || die "no bare_pingora binary at $bare"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-e2e.XXXXXX")
pids=()
# shellcheck source=benches/lib.sh
source "$root/benches/lib.sh"

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM


# Starts tollgate on $2 (metrics on $3) with config body $4 for the origin; sets started_pid.
start_tollgate() {
  local name=$1 port=$2 metrics=$3 limits=$4
  cat >"$tmp/$name.yaml" <<EOF
server:
  listen: ["127.0.0.1:$port"]
  metrics: "127.0.0.1:$metrics"
  threads: $workers
  grace_period: 0s
origins:
  bench:
    hosts: ["$host"]
    upstreams: ["127.0.0.1:$up_port"]
    customer: bench
$limits
EOF
  RUST_LOG=warn "$bin" run --config "$tmp/$name.yaml" --upgrade-sock "$tmp/$name.sock" \
    --pid-file "$tmp/$name.pid" >"$tmp/$name.log" 2>&1 &
  started_pid=$!
  pids+=("$started_pid")
}

# ---------------------------------------------------------------------------------------
# Start everything.

up_port="" p="" metrics_a="" metrics_b="" # set by free_port
free_port up_port
start_nginx upstream "server {
        listen 127.0.0.1:$up_port backlog=4096;
        location / { return 200 \"ok\\n\"; }
    }"
up_pid=$started_pid
wait_ready "$up_pid" "$up_port" upstream

declare -A port pid log_of
free_port p
free_port metrics_a
port[a]=$p log_of[a]=tollgate-a
start_tollgate tollgate-a "${port[a]}" "$metrics_a" ""
pid[a]=$started_pid

free_port p
free_port metrics_b
port[b]=$p log_of[b]=tollgate-b
start_tollgate tollgate-b "${port[b]}" "$metrics_b" "    limits:
      conc: { kind: inflight, max: 100000 }
      per_client: { kind: rate, key: [client_ip], max: 100000000, per: 1s }
      tokens: { kind: token_bucket, key: [client_ip], capacity: 100000000, refill: { amount: 100000000, every: 1s } }"
pid[b]=$started_pid

free_port p
port[p]=$p log_of[p]=bare-pingora
"$bare" "127.0.0.1:${port[p]}" "127.0.0.1:$up_port" "$workers" >"$tmp/bare-pingora.log" 2>&1 &
pid[p]=$!
pids+=("${pid[p]}")

free_port p
port[c]=$p log_of[c]=nginx-proxy
start_nginx nginx-proxy "limit_req_zone \$binary_remote_addr zone=per_client:10m rate=100000000r/s;
    limit_conn_zone \$binary_remote_addr zone=conc:10m;
    upstream bench { server 127.0.0.1:$up_port; keepalive 64; }
    server {
        listen 127.0.0.1:${port[c]} backlog=4096;
        location / {
            # nginx counts in whole milliseconds: the burst absorbs the requests of one ms.
            limit_req zone=per_client burst=100000 nodelay;
            limit_conn conc 60000;
            proxy_pass http://bench;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header Host \$host;
        }
    }"
pid[c]=$started_pid

declare -A label=(
  [p]="bare Pingora (examples/bare_pingora)"
  [a]="tollgate, no limits"
  [b]="tollgate, inflight + rate + token bucket"
  [c]="nginx, limit_req + limit_conn"
)
for v in p a b c; do
  wait_ready "${pid[$v]}" "${port[$v]}" "${log_of[$v]}"
done
log "upstream :$up_port, proxies a :${port[a]} b :${port[b]} c :${port[c]}, $workers workers each"

# ---------------------------------------------------------------------------------------
# Load.

clk_tck=$(getconf CLK_TCK)
results=$tmp/results.tsv
failed=0

# Runs wrk for $2 seconds against variant $1; with $3 = record, appends a result line:
# variant round rps p50_us p99_us cpu_us_per_req requests bad
run_wrk() {
  local v=$1 secs=$2 mode=$3 round=${4:-0} before after out
  before=$(cpu_ticks "${pid[$v]}")
  out=$(wrk --latency -t "$wrk_threads" -c "$conns" -d "${secs}s" -H "Host: $host" \
    "http://127.0.0.1:${port[$v]}/" 2>&1) || die "wrk failed against ${label[$v]}: $out"
  after=$(cpu_ticks "${pid[$v]}")
  [[ $mode == record ]] || return 0
  echo "$out" >"$tmp/wrk-$v-$round.txt"
  awk -v v="$v" -v round="$round" -v ticks=$((after - before)) -v hz="$clk_tck" '
    function us(s) {
      if (s ~ /us$/) return s + 0
      if (s ~ /ms$/) return (s + 0) * 1000
      if (s ~ /s$/) return (s + 0) * 1000000
      return s + 0
    }
    /^ +50%/ { p50 = us($2) }
    /^ +99%/ { p99 = us($2) }
    / requests in / { req = $1 }
    /Non-2xx or 3xx responses:/ { bad += $NF }
    /Socket errors:/ { gsub(/,/, ""); bad += $4 + $6 + $8 + $10 }
    /^Requests\/sec:/ { rps = $2 }
    END {
      cpu = req > 0 ? ticks * 1000000 / hz / req : 0
      printf "%s\t%d\t%.0f\t%.0f\t%.0f\t%.2f\t%d\t%d\n", v, round, rps, p50, p99, cpu, req, bad
    }' <<<"$out" >>"$results"
}

for v in p a b c; do
  run_wrk "$v" "$warmup" warmup
done
for ((r = 1; r <= rounds; r++)); do
  for v in p a b c; do
    run_wrk "$v" "$duration" record "$r"
    IFS=$'\t' read -r _ _ rps p50 p99 cpu req bad < <(tail -n 1 "$results")
    log "round $r/$rounds ${label[$v]}: $rps req/s, p50 ${p50} µs, p99 ${p99} µs, CPU ${cpu} µs/req, $req requests, $bad bad"
    if ((req == 0 || bad * 100 > req)); then
      log "FAIL: ${label[$v]} served $req requests with $bad non-2xx/3xx or socket errors"
      failed=1
    fi
  done
done

# The limits of (b) must have run: every one reports allowed decisions, none rejected.
decisions=$(http_get "$metrics_b" /metrics | awk '
  /^tollgate_limit_decisions_total/ {
    match($0, /limit="[^"]*"/); limit = substr($0, RSTART + 7, RLENGTH - 8)
    match($0, /decision="[^"]*"/); d = substr($0, RSTART + 10, RLENGTH - 11)
    n[limit "/" d] += $NF
  }
  END { for (k in n) if (n[k] > 0) printf "%s=%d ", k, n[k] }')
log "tollgate (b) limit decisions: ${decisions:-none}"
for limit in conc per_client tokens; do
  if [[ $decisions != *"$limit/allowed="* ]]; then
    log "FAIL: limit $limit of tollgate (b) made no allowed decision"
    failed=1
  fi
done
if [[ $decisions == *"/rejected="* ]]; then
  log "FAIL: tollgate (b) rejected requests; the limits are meant to be out of reach"
  failed=1
fi

# ---------------------------------------------------------------------------------------
# Report: medians over rounds.

echo
echo "## End to end: wrk -t$wrk_threads -c$conns, ${duration}s x $rounds rounds, $workers workers per proxy, loopback"
echo
echo "CPU µs/req = proxy utime+stime (all threads; nginx: master + workers) / requests served."
echo "Medians over rounds; the upstream is nginx returning 200 \"ok\"."
echo
awk -F'\t' -v lp="${label[p]}" -v la="${label[a]}" -v lb="${label[b]}" -v lc="${label[c]}" '
  function median(v, k,    a, n, i, j, t) {
    n = split(vals[v, k], a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  {
    for (k = 3; k <= 8; k++) vals[$1, k] = vals[$1, k] (vals[$1, k] == "" ? "" : " ") $k
    round_cpu[$1, $2] = $6; if ($2 > last) last = $2
  }
  END {
    name["p"] = lp; name["a"] = la; name["b"] = lb; name["c"] = lc
    print "| proxy | req/s | p50 µs | p99 µs | CPU µs/req | requests | non-2xx + errors |"
    print "|---|---:|---:|---:|---:|---:|---:|"
    split("p a b c", order, " ")
    for (i = 1; i <= 4; i++) {
      v = order[i]
      cpu[v] = median(v, 6)
      printf "| %s | %.0f | %.0f | %.0f | %.2f | %.0f | %.0f |\n", name[v], median(v, 3), median(v, 4), median(v, 5), cpu[v], median(v, 7), median(v, 8)
    }
    print ""
    print "### Ratios (CPU per request, this run)"
    print ""
    per_round = ""
    for (i = 1; i <= last; i++)
      if (round_cpu["a", i] > 0) per_round = per_round sprintf(" %.3f", round_cpu["b", i] / round_cpu["a", i])
    r = cpu["a"] > 0 ? cpu["b"] / cpu["a"] : 0
    printf "- tollgate with limits / tollgate without: %.3f (%s: the budget is within 2%%, i.e. <= 1.020; per round:%s)\n", r, r <= 1.02 ? "PASS" : "MISS", per_round
    if (cpu["p"] > 0)
      printf "- tollgate without limits / bare Pingora: %.2f\n", cpu["a"] / cpu["p"]
    if (cpu["c"] > 0) {
      if (cpu["p"] > 0) printf "- bare Pingora / nginx: %.2f\n", cpu["p"] / cpu["c"]
      printf "- tollgate without limits / nginx: %.2f\n", cpu["a"] / cpu["c"]
      printf "- tollgate with limits / nginx: %.2f\n", cpu["b"] / cpu["c"]
    }
  }' "$results"

if ((failed)); then
  log "a proxy failed to serve; see above"
  exit 1
fi
