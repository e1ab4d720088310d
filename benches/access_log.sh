#!/usr/bin/env bash
# What the access log costs, side by side in one run on loopback (127.0.0.1 only):
#   (o) tollgate with the access log off,
#   (j) tollgate writing json lines to a file (server.access_log, format json),
#   (c) tollgate writing combined lines to a file (format combined),
#   (n) nginx as a reverse proxy with `access_log off`, and
#   (m) nginx with its access log on (combined, to a file),
# all in front of the same nginx upstream answering `200 ok`, with the same worker count.
#
# Load: wrk, AL_CONNECTIONS connections, Host: bench.local, AL_ROUNDS rounds cycling
# o -> j -> c -> n -> m. Per run: requests/s and the proxy's CPU time per request (utime +
# stime from /proc/PID/stat of the proxy, and of nginx's workers, before and after, divided
# by the requests served). It prints the medians and the ratios json / off and combined /
# off (the budget: json costs at most 3% more CPU per request, i.e. <= 1.030) and nginx's
# own on / off as the anchor. It also checks that each logging variant wrote a line for
# every request wrk counted. The machine is shared and noisy: compare the ratios of one run.
#
# Run:     benches/access_log.sh                    (about 2 minutes after the build)
# CI:      AL_DURATION=1 AL_ROUNDS=1 benches/access_log.sh
# Knobs:   AL_DURATION (s, 10)  AL_ROUNDS (3)  AL_WORKERS (2)  AL_CONNECTIONS (32)
#          AL_WARMUP (s, 1)  TOLLGATE_BIN (skip the cargo build)
# Needs:   wrk and nginx (installed through scripts/deps.sh when missing), cargo.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
duration=${AL_DURATION:-10}
rounds=${AL_ROUNDS:-3}
workers=${AL_WORKERS:-2}
conns=${AL_CONNECTIONS:-32}
warmup=${AL_WARMUP:-1}
host=bench.local

log() { printf 'access_log: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

"$root/scripts/deps.sh" wrk nginx

if [[ -n ${TOLLGATE_BIN:-} ]]; then
  bin=$TOLLGATE_BIN
else
  log "cargo build --release"
  (cd "$root" && cargo build --release --quiet --bin tollgate)
  bin=$root/target/release/tollgate
fi
[[ -x $bin ]] || die "no tollgate binary at $bin"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-access-log.XXXXXX")
pids=()
# shellcheck source=benches/lib.sh
source "$root/benches/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Starts tollgate $1 on port $2 with server keys $3 (indented); sets started_pid.
start_tollgate() {
  local name=$1 port=$2 extra=$3 metrics
  free_port metrics
  cat >"$tmp/$name.yaml" <<EOF
server:
  listen: ["127.0.0.1:$port"]
  metrics: "127.0.0.1:$metrics"
  threads: $workers
  grace_period: 0s
$extra
origins:
  bench:
    hosts: ["$host"]
    upstreams: ["127.0.0.1:$up_port"]
    customer: bench
EOF
  RUST_LOG=warn "$bin" run --config "$tmp/$name.yaml" --upgrade-sock "$tmp/$name.sock" \
    --pid-file "$tmp/$name.pid" >"$tmp/$name.log" 2>&1 &
  started_pid=$!
  pids+=("$started_pid")
}

up_port="" p=""
free_port up_port
start_nginx upstream "server {
        listen 127.0.0.1:$up_port backlog=4096;
        location / { return 200 \"ok\\n\"; }
    }"
wait_ready "$started_pid" "$up_port" upstream

declare -A port pid label logfile
label[o]="tollgate, access log off"
label[j]="tollgate, json to a file"
label[c]="tollgate, combined to a file"
label[n]="nginx, access_log off"
label[m]="nginx, access_log combined to a file"

free_port p; port[o]=$p
start_tollgate tollgate-o "$p" ""
pid[o]=$started_pid
free_port p; port[j]=$p; logfile[j]=$tmp/json.log
start_tollgate tollgate-j "$p" "  access_log: { path: $tmp/json.log, format: json }"
pid[j]=$started_pid
free_port p; port[c]=$p; logfile[c]=$tmp/combined.log
start_tollgate tollgate-c "$p" "  access_log: { path: $tmp/combined.log, format: combined }"
pid[c]=$started_pid
for v in n m; do
  free_port p; port[$v]=$p
  logging="access_log off;"
  if [[ $v == m ]]; then
    logfile[m]=$tmp/nginx-access.log
    logging="access_log ${logfile[m]} combined;"
  fi
  start_nginx "nginx-$v" "upstream bench { server 127.0.0.1:$up_port; keepalive 64; }
    server {
        listen 127.0.0.1:$p backlog=4096;
        $logging
        location / {
            proxy_pass http://bench;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header Host \$host;
        }
    }"
  pid[$v]=$started_pid
done
for v in o j c n m; do
  wait_ready "${pid[$v]}" "${port[$v]}" "variant-$v"
done

clk_tck=$(getconf CLK_TCK)
results=$tmp/results.tsv
failed=0
declare -A served

# Runs wrk for $2 s against variant $1; with $3 = record, appends: variant round rps cpu req bad
run_wrk() {
  local v=$1 secs=$2 mode=$3 round=${4:-0} before after out
  before=$(cpu_ticks "${pid[$v]}")
  out=$(wrk -t 1 -c "$conns" -d "${secs}s" -H "Host: $host" "http://127.0.0.1:${port[$v]}/" 2>&1) ||
    die "wrk failed against ${label[$v]}: $out"
  after=$(cpu_ticks "${pid[$v]}")
  local req
  req=$(awk '/ requests in / { print $1 }' <<<"$out")
  served[$v]=$((${served[$v]:-0} + req))
  [[ $mode == record ]] || return 0
  awk -v v="$v" -v round="$round" -v ticks=$((after - before)) -v hz="$clk_tck" '
    / requests in / { req = $1 }
    /Non-2xx or 3xx responses:/ { bad += $NF }
    /Socket errors:/ { gsub(/,/, ""); bad += $4 + $6 + $8 + $10 }
    /^Requests\/sec:/ { rps = $2 }
    END { cpu = req > 0 ? ticks * 1000000 / hz / req : 0; printf "%s\t%d\t%.0f\t%.3f\t%d\t%d\n", v, round, rps, cpu, req, bad }
  ' <<<"$out" >>"$results"
}

for v in o j c n m; do
  run_wrk "$v" "$warmup" warmup
done
for ((r = 1; r <= rounds; r++)); do
  for v in o j c n m; do
    run_wrk "$v" "$duration" record "$r"
    IFS=$'\t' read -r _ _ rps cpu req bad < <(tail -n 1 "$results")
    log "round $r/$rounds ${label[$v]}: $rps req/s, CPU $cpu µs/req, $req requests, $bad bad"
    if ((req == 0 || bad * 100 > req)); then
      log "FAIL: ${label[$v]} served $req requests with $bad errors"
      failed=1
    fi
  done
done

# A line per request served (the writer flushes every 50 ms): at least as many lines as wrk
# counted; a few more are the readiness probes and the requests wrk left in flight at the
# end of each run (at most one per connection).
sleep 1
for v in j c m; do
  lines=$(wc -l <"${logfile[$v]}")
  log "${label[$v]}: $lines lines for ${served[$v]} requests wrk counted"
  if ((lines < served[$v])); then
    log "MISS: ${label[$v]} wrote $lines lines for ${served[$v]} requests: lines were dropped"
  fi
done

echo
echo "## Access log: wrk -t1 -c$conns, ${duration}s x $rounds rounds, $workers workers per proxy, loopback"
echo
echo "CPU µs/req = proxy utime+stime (tollgate: all threads, the writer's included; nginx: master + workers) / requests."
echo
awk -F'\t' -v lo="${label[o]}" -v lj="${label[j]}" -v lc="${label[c]}" -v ln="${label[n]}" -v lm="${label[m]}" '
  function median(v, k,    a, n, i, j, t) {
    n = split(vals[v, k], a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { for (k = 3; k <= 6; k++) vals[$1, k] = vals[$1, k] (vals[$1, k] == "" ? "" : " ") $k }
  END {
    name["o"] = lo; name["j"] = lj; name["c"] = lc; name["n"] = ln; name["m"] = lm
    print "| proxy | req/s | CPU µs/req | requests |"
    print "|---|---:|---:|---:|"
    split("o j c n m", order, " ")
    for (i = 1; i <= 5; i++) {
      v = order[i]; cpu[v] = median(v, 4)
      printf "| %s | %.0f | %.2f | %.0f |\n", name[v], median(v, 3), cpu[v], median(v, 5)
    }
    print ""
    if (cpu["o"] > 0) {
      r = cpu["j"] / cpu["o"]
      printf "- json / off: %.3f (%s: the budget is <= 1.030)\n", r, r <= 1.03 ? "PASS" : "MISS"
      printf "- combined / off: %.3f\n", cpu["c"] / cpu["o"]
    }
    if (cpu["n"] > 0) printf "- nginx on / off: %.3f\n", cpu["m"] / cpu["n"]
  }' "$results"

((failed == 0)) || exit 1
