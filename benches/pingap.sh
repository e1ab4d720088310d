#!/usr/bin/env bash
# Side-by-side CPU cost of a request through tollgate and through Pingap, the closest peer
# (a Pingora-based proxy with a limit plugin), on loopback (127.0.0.1 only):
#   (a) tollgate, no limits
#   (b) tollgate, an inflight limit and a rate limit on the client IP (out of reach)
#   (x) Pingap, no plugins
#   (y) Pingap, its limit plugin twice: `type = "inflight"` and `type = "rate"`, `tag = "ip"`
#       (out of reach)
# all with one worker thread, in front of the same nginx upstream answering `200 ok`.
#
# Load: wrk -t1 -c32, PG_ROUNDS rounds cycling a -> b -> x -> y. CPU per request is the
# proxy's utime + stime (all its threads, from /proc) over the requests served. Prints the
# medians and the ratios b / y and a / x (the issue's measure: tollgate with limits must cost
# at most Pingap with limits in one run). Compare ratios of one run, never across runs.
#
# Pingap is not built here (its code is not part of this repository): build it once from
# its repository, e.g. `git clone https://github.com/vicanso/pingap && cd pingap && git
# checkout v0.13.9 && CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
# cargo build --release` (the same settings as tollgate's `release-plain` profile, so that
# neither side gets link-time optimisation the other lacks), and pass its binary.
#
# Run:     PINGAP_BIN=/path/to/pingap TOLLGATE_BIN=target/release-plain/tollgate benches/pingap.sh
# Knobs:   PG_DURATION (s, 10)  PG_ROUNDS (5)  PG_CONNECTIONS (32)  PG_WARMUP (s, 2)
# Needs:   wrk, nginx (scripts/deps.sh installs them), a Pingap binary.
# Exit:    non-zero when a proxy failed to serve (no requests, or over 1% non-2xx/3xx or
#          socket errors, or a limit that never decided); the ratio is reported, not judged.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
duration=${PG_DURATION:-10}
rounds=${PG_ROUNDS:-5}
conns=${PG_CONNECTIONS:-32}
warmup=${PG_WARMUP:-2}
host=bench.local

log() { printf 'pingap: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

"$root/scripts/deps.sh" wrk nginx
bin=${TOLLGATE_BIN:-$root/target/release-plain/tollgate}
pingap=${PINGAP_BIN:-}
[[ -x $bin ]] || die "no tollgate binary at $bin (cargo build --profile release-plain)"
[[ -n $pingap && -x $pingap ]] || die "set PINGAP_BIN to a Pingap binary (see the header)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-pingap.XXXXXX")
pids=()
# shellcheck source=benches/lib.sh
source "$root/benches/lib.sh"
# shellcheck source=benches/pingap_conf.sh
source "$root/benches/pingap_conf.sh"
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Starts tollgate $1 on port $2, metrics on $3, with limits body $4; sets started_pid.
start_tollgate() {
  local name=$1 port=$2 metrics=$3 limits=$4
  cat >"$tmp/$name.yaml" <<EOF
server:
  listen: ["127.0.0.1:$port"]
  metrics: "127.0.0.1:$metrics"
  threads: 1
  grace_period: 0s
origins:
  bench:
    hosts: ["$host"]
    upstreams: ["127.0.0.1:$up_port"]
$limits
EOF
  RUST_LOG=warn "$bin" run --config "$tmp/$name.yaml" --upgrade-sock "$tmp/$name.sock" \
    --pid-file "$tmp/$name.pid" >"$tmp/$name.log" 2>&1 &
  started_pid=$!
  pids+=("$started_pid")
}

# Starts Pingap $1 on port $2 with the plugin list $3 (TOML array body) and plugin tables $4.
start_pingap() {
  local name=$1 port=$2 plugins=$3 tables=$4
  pingap_toml "$name" "$port" "$up_port" "$plugins" "$tables"
  "$pingap" -c "$tmp/$name.toml" >"$tmp/$name.log" 2>&1 &
  started_pid=$!
  pids+=("$started_pid")
}

up_port="" p="" m="" # set by free_port
free_port up_port
start_nginx upstream "server {
        listen 127.0.0.1:$up_port backlog=4096;
        location / { return 200 \"ok\\n\"; }
    }"
wait_ready "$started_pid" "$up_port" upstream

declare -A port pid log_of label
free_port p
free_port m
port[a]=$p log_of[a]=tollgate-a label[a]="tollgate, no limits"
start_tollgate tollgate-a "$p" "$m" ""
pid[a]=$started_pid

free_port p
free_port metrics_b
port[b]=$p log_of[b]=tollgate-b label[b]="tollgate, inflight + rate on the client IP"
start_tollgate tollgate-b "$p" "$metrics_b" "$TOLLGATE_LIMIT_PAIR"
pid[b]=$started_pid

free_port p
port[x]=$p log_of[x]=pingap-x label[x]="Pingap, no plugins"
start_pingap pingap-x "$p" "" ""
pid[x]=$started_pid

free_port p
port[y]=$p log_of[y]=pingap-y label[y]="Pingap, limit plugin: inflight + rate on the IP"
start_pingap pingap-y "$p" "$PINGAP_LIMIT_PLUGINS" "$PINGAP_LIMIT_TABLES"
pid[y]=$started_pid

order=(a b x y)
for v in "${order[@]}"; do
  wait_ready "${pid[$v]}" "${port[$v]}" "${log_of[$v]}"
done
log "upstream :$up_port; a :${port[a]} b :${port[b]} x :${port[x]} y :${port[y]}; one worker each"

clk_tck=$(getconf CLK_TCK)
results=$tmp/results.tsv
failed=0

# Runs wrk for $2 s against variant $1; with $3 = record appends:
# variant round rps p50_us p99_us cpu_us_per_req requests bad
run_wrk() {
  local v=$1 secs=$2 mode=$3 round=${4:-0} before after out
  before=$(cpu_ticks "${pid[$v]}")
  out=$(wrk --latency -t1 -c "$conns" -d "${secs}s" -H "Host: $host" \
    "http://127.0.0.1:${port[$v]}/" 2>&1) || die "wrk failed against ${label[$v]}: $out"
  after=$(cpu_ticks "${pid[$v]}")
  [[ $mode == record ]] || return 0
  local rps p50 p99 req bad cpu
  IFS=$'\t' read -r rps p50 p99 req bad < <(wrk_summary "$out")
  cpu=$(awk -v t=$((after - before)) -v hz="$clk_tck" -v n="$req" 'BEGIN { printf "%.2f", (n > 0 ? t * 1000000 / hz / n : 0) }')
  printf '%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\n' "$v" "$round" "$rps" "$p50" "$p99" "$cpu" "$req" "$bad" >>"$results"
}

for v in "${order[@]}"; do
  run_wrk "$v" "$warmup" warmup
done
for ((r = 1; r <= rounds; r++)); do
  for v in "${order[@]}"; do
    run_wrk "$v" "$duration" record "$r"
    IFS=$'\t' read -r _ _ rps p50 p99 cpu req bad < <(tail -n 1 "$results")
    log "round $r/$rounds ${label[$v]}: $rps req/s, p50 $p50 µs, p99 $p99 µs, CPU $cpu µs/req, $bad bad"
    if ((req == 0 || bad * 100 > req)); then
      log "FAIL: ${label[$v]} served $req requests with $bad non-2xx/3xx or socket errors"
      failed=1
    fi
  done
done

# tollgate's limits must have decided (Pingap's plugin has no counter to read).
decisions=$(http_get "$metrics_b" /metrics | awk '
  /^tollgate_limit_decisions_total/ && /decision="allowed"/ {
    match($0, /limit="[^"]*"/); n[substr($0, RSTART + 7, RLENGTH - 8)] += $NF
  }
  END { for (k in n) printf "%s=%d ", k, n[k] }')
log "tollgate (b) allowed decisions: ${decisions:-none}"
for limit in conc per_client; do
  [[ $decisions == *"$limit="* ]] || { log "FAIL: limit $limit of tollgate (b) never decided"; failed=1; }
done

echo
echo "## tollgate vs Pingap: wrk -t1 -c$conns, ${duration}s x $rounds rounds, one worker each, loopback"
echo
awk -F'\t' -v la="${label[a]}" -v lb="${label[b]}" -v lx="${label[x]}" -v ly="${label[y]}" '
  function median(v, k,    a, n, i, j, t) {
    n = split(vals[v, k], a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  {
    for (k = 3; k <= 8; k++) vals[$1, k] = vals[$1, k] (vals[$1, k] == "" ? "" : " ") $k
    cpu_of[$1, $2] = $6; if ($2 > last) last = $2
  }
  END {
    name["a"] = la; name["b"] = lb; name["x"] = lx; name["y"] = ly
    print "| proxy | req/s | p50 µs | p99 µs | CPU µs/req |"
    print "|---|---:|---:|---:|---:|"
    split("a b x y", order, " ")
    for (i = 1; i <= 4; i++) {
      v = order[i]; cpu[v] = median(v, 6)
      printf "| %s | %.0f | %.0f | %.0f | %.2f |\n", name[v], median(v, 3), median(v, 4), median(v, 5), cpu[v]
    }
    by = ""; ax = ""
    for (i = 1; i <= last; i++) {
      if (cpu_of["y", i] > 0) by = by sprintf(" %.3f", cpu_of["b", i] / cpu_of["y", i])
      if (cpu_of["x", i] > 0) ax = ax sprintf(" %.3f", cpu_of["a", i] / cpu_of["x", i])
    }
    print ""
    printf "- tollgate with limits / Pingap with limits: %.3f (per round:%s)\n", cpu["b"] / cpu["y"], by
    printf "- bare tollgate / bare Pingap: %.3f (per round:%s)\n", cpu["a"] / cpu["x"], ax
    printf "- tollgate limits cost: %.3f; Pingap limits cost: %.3f\n", cpu["b"] / cpu["a"], cpu["y"] / cpu["x"]
  }' "$results"

if ((failed)); then
  log "a proxy failed to serve; see above"
  exit 1
fi
