#!/usr/bin/env bash
# The edge, side by side with nginx on loopback (127.0.0.1 only), both on ONE worker (tollgate
# `server.threads: 1`, nginx `worker_processes 1`), the same self-signed ECDSA P-256
# certificate, TLS 1.2 and 1.3, the same limits where nginx has them (an inflight / limit_conn
# and a per-client rate / limit_req, set out of reach), in front of the same nginx upstream
# answering `200 ok`:
#
#   1. Full TLS handshakes: `openssl s_time -new` (no session reuse; EDGE_HS_CLIENTS of them
#      in parallel) for EDGE_HS_SECS; handshakes a second, and the server's CPU time per
#      handshake (so handshakes per CPU-second: what one worker sustains when saturated).
#   2. CPU per request, HTTP/1.1 over TLS: `h2load --h1 -c100` (100 requests at a time, one
#      per connection, kept alive) and h2 over TLS: `h2load -c10 -m10` (100 streams over 10
#      connections), EDGE_REQUESTS requests each; the proxy's utime + stime (/proc/PID/stat;
#      nginx: master + worker) over the run, divided by the requests.
#   3. Rapid reset (CVE-2023-44487): a normal h2c client (`h2load -c1 -m1 --rps 200` for
#      EDGE_ATTACK_SECS, per-request times from its --log-file) alone, then while
#      examples/rapid_reset opens and resets streams in a loop on other connections; p50, p99
#      and max of the normal client's requests, and what the attacker got.
#
# Rounds alternate tollgate and nginx; medians over EDGE_ROUNDS. The machine is shared and
# noisy: compare the ratios of one run. tollgate links OpenSSL 3.6 (the openssl crate's
# vendored build); Debian's nginx links the system's OpenSSL 3.0; the report says both.
#
# Run:    benches/edge.sh                     (release build, then about 4 minutes)
# Smoke:  EDGE_SMOKE=1 TOLLGATE_BIN=target/debug/tollgate benches/edge.sh   (seconds)
# Knobs:  EDGE_ROUNDS (3)  EDGE_HS_SECS (10)  EDGE_HS_CLIENTS (2)  EDGE_REQUESTS (50000)
#         EDGE_ATTACK_SECS (10)  TOLLGATE_BIN (skip the cargo build)
# Exit:   non-zero when a proxy failed to serve (a non-2xx or an errored request in the load
#         runs, no handshake, or a normal request failing during the attack).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -n ${EDGE_SMOKE:-} ]]; then
  rounds=1 hs_secs=1 hs_clients=1 requests=1000 attack_secs=2
else
  rounds=${EDGE_ROUNDS:-3} hs_secs=${EDGE_HS_SECS:-10} hs_clients=${EDGE_HS_CLIENTS:-2}
  requests=${EDGE_REQUESTS:-50000} attack_secs=${EDGE_ATTACK_SECS:-10}
fi
host=bench.local

log() { printf 'edge: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

"$root/scripts/deps.sh" nginx

if [[ -n ${TOLLGATE_BIN:-} ]]; then
  bin=$TOLLGATE_BIN
  profile_dir=$(dirname "$bin")
  attacker=$profile_dir/examples/rapid_reset
  if [[ ! -x $attacker ]]; then
    if [[ $(basename "$profile_dir") == release ]]; then
      (cd "$root" && cargo build --release --quiet --example rapid_reset)
    else
      (cd "$root" && cargo build --quiet --example rapid_reset)
    fi
  fi
else
  log "cargo build --release (tollgate and examples/rapid_reset)"
  (cd "$root" && cargo build --release --quiet --bin tollgate --example rapid_reset)
  bin=$root/target/release/tollgate
  attacker=$root/target/release/examples/rapid_reset
fi
[[ -x $bin ]] || die "no tollgate binary at $bin"
[[ -x $attacker ]] || die "no rapid_reset example at $attacker"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-edge.XXXXXX")
pids=()
# shellcheck source=benches/lib.sh
source "$root/benches/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The shared certificate: ECDSA P-256, SAN bench.local, two days.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=$host" -addext "subjectAltName=DNS:$host" \
  -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>/dev/null || die "openssl could not make the certificate"

# Waits until https://bench.local:$2/ answers 2xx while PID $1 runs (30 s at most).
wait_tls() {
  local pid=$1 port=$2 name=$3 tries code=""
  for ((tries = 0; tries < 300; tries++)); do
    running "$pid" || die "$name exited at start; its log: $(tail -n 20 "$tmp/$name.log" 2>/dev/null)"
    code=$(curl -sk --max-time 5 -o /dev/null -w '%{http_code}' \
      --resolve "$host:$port:127.0.0.1" "https://$host:$port/" 2>/dev/null || true)
    [[ $code == 2* ]] && return
    sleep 0.1
  done
  die "$name did not answer 2xx on $port (last: ${code:-none}); its log: $(tail -n 20 "$tmp/$name.log" 2>/dev/null)"
}

up_port="" t_tls="" t_h2c="" t_metrics="" n_tls="" n_h2c=""
free_port up_port
start_nginx upstream "server { listen 127.0.0.1:$up_port backlog=4096; location / { return 200 \"ok\\n\"; } }"
up_pid=$started_pid

free_port t_tls
free_port t_h2c
free_port t_metrics
cat >"$tmp/tollgate.yaml" <<EOF
server:
  listen: [{ addr: "127.0.0.1:$t_tls", tls: true }, { addr: "127.0.0.1:$t_h2c", h2c: true }]
  metrics: "127.0.0.1:$t_metrics"
  threads: 1
  grace_period: 0s
tls:
  certificates:
    - { cert: "$tmp/cert.pem", key: "$tmp/key.pem" }
  default: "$tmp/cert.pem"
origins:
  bench:
    hosts: ["$host"]
    upstreams: ["127.0.0.1:$up_port"]
    limits:
      conc: { kind: inflight, key: [client_ip], max: 60000 }
      per_client: { kind: rate, key: [client_ip], max: 100000000, per: 1s }
EOF
RUST_LOG=warn "$bin" run --config "$tmp/tollgate.yaml" --upgrade-sock "$tmp/tollgate.sock" \
  --pid-file "$tmp/tollgate.pid" >"$tmp/tollgate.log" 2>&1 &
tollgate_pid=$!
pids+=("$tollgate_pid")

free_port n_tls
free_port n_h2c
start_nginx nginx "limit_req_zone \$binary_remote_addr zone=per_client:10m rate=100000000r/s;
    limit_conn_zone \$binary_remote_addr zone=conc:10m;
    upstream bench { server 127.0.0.1:$up_port; keepalive 64; }
    server {
        listen 127.0.0.1:$n_tls ssl http2 backlog=4096;
        listen 127.0.0.1:$n_h2c http2 backlog=4096;
        ssl_certificate $tmp/cert.pem;
        ssl_certificate_key $tmp/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        # nginx closes a connection after 1000 requests by default; tollgate does not.
        keepalive_requests 100000000;
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
nginx_pid=$started_pid

declare -A pid=([t]=$tollgate_pid [n]=$nginx_pid) tls=([t]=$t_tls [n]=$n_tls) h2c=([t]=$t_h2c [n]=$n_h2c)
declare -A label=([t]="tollgate" [n]="nginx")
wait_tls "$tollgate_pid" "$t_tls" tollgate
wait_tls "$nginx_pid" "$n_tls" nginx
log "upstream :$up_port; tollgate TLS :$t_tls h2c :$t_h2c; nginx TLS :$n_tls h2c :$n_h2c"

# What a handshake agrees with each (s_client): version and cipher, key exchange.
declare -A agreed
for v in t n; do
  agreed[$v]=$(openssl s_client -connect "127.0.0.1:${tls[$v]}" -servername "$host" </dev/null 2>&1 |
    awk '/^New, / { sub(/^New, /, ""); printf "%s%s", sep, $0; sep = ", " }
         /^Server Temp Key:/ { sub(/^Server Temp Key: /, ""); printf "%skey exchange %s", sep, $0; sep = ", " }')
done

clk_tck=$(getconf CLK_TCK)
results=$tmp/results.tsv
failed=0
: >"$results"

# Full handshakes against variant $1 for $hs_secs: appends "hs v round handshakes cpu_us/hs".
run_handshakes() {
  local v=$1 round=$2 before after i total=0 n clients=()
  before=$(cpu_ticks "${pid[$v]}")
  for ((i = 0; i < hs_clients; i++)); do
    openssl s_time -connect "127.0.0.1:${tls[$v]}" -new -time "$hs_secs" >"$tmp/stime-$v-$i.txt" 2>&1 &
    clients+=($!)
  done
  wait "${clients[@]}" || true
  after=$(cpu_ticks "${pid[$v]}")
  for ((i = 0; i < hs_clients; i++)); do
    # "N connections in T real seconds, ..."
    n=$(awk '/connections in .* real seconds/ { print $1; exit }' "$tmp/stime-$v-$i.txt")
    total=$((total + ${n:-0}))
  done
  if ((total == 0)); then
    log "FAIL: no handshake with ${label[$v]}: $(cat "$tmp/stime-$v-0.txt")"
    failed=1
    return
  fi
  awk -v v="$v" -v r="$round" -v n="$total" -v s="$hs_secs" -v ticks=$((after - before)) -v hz="$clk_tck" \
    'BEGIN { printf "hs\t%s\t%d\t%.0f\t%.1f\n", v, r, n / s, ticks * 1000000 / hz / n }' >>"$results"
}

# h2load against variant $1 over TLS, protocol $2 (h1 | h2), $3 requests; with $4 = record
# appends "$2 v round req/s cpu_us/req".
run_load() {
  local v=$1 proto=$2 n=$3 mode=$4 round=${5:-0} before after out args
  if [[ $proto == h1 ]]; then args=(--h1 -c 100 -m 1); else args=(-c 10 -m 10); fi
  before=$(cpu_ticks "${pid[$v]}")
  out=$(h2load "${args[@]}" -n "$n" "--connect-to=127.0.0.1:${tls[$v]}" \
    "https://$host:${tls[$v]}/" 2>&1) || die "h2load failed against ${label[$v]}: $out"
  after=$(cpu_ticks "${pid[$v]}")
  local ok errored
  ok=$(awk '/^status codes:/ { print $3 }' <<<"$out")
  errored=$(awk -F', ' '/^requests:/ { for (i = 1; i <= NF; i++) if ($i ~ /errored/) print $i + 0 }' <<<"$out")
  if [[ ${ok:-0} != "$n" || ${errored:-1} != 0 ]]; then
    log "FAIL: ${label[$v]} $proto: $ok of $n were 2xx, $errored errored"
    echo "$out" >&2
    failed=1
  fi
  [[ $mode == record ]] || return 0
  awk -v p="$proto" -v v="$v" -v r="$round" -v n="$n" -v ticks=$((after - before)) -v hz="$clk_tck" '
    /^finished in/ { rps = $4 }
    END { printf "%s\t%s\t%d\t%.0f\t%.2f\n", p, v, r, rps, ticks * 1000000 / hz / n }' <<<"$out" >>"$results"
}

# The normal h2c client against variant $1 for $attack_secs, with ($2 = attack) or without
# the attacker; appends "rr v attack p50_us p99_us max_us requests bad attacker-summary".
run_normal() {
  local v=$1 attack=$2 summary="-" out att_pid=""
  rm -f "$tmp/normal.log"
  if [[ $attack == attack ]]; then
    "$attacker" "127.0.0.1:${h2c[$v]}" "$host" $((attack_secs + 1)) >"$tmp/attacker.txt" 2>&1 &
    att_pid=$!
    sleep 0.5 # the attack is under way before the normal client starts
  fi
  out=$(h2load -c 1 -m 1 --rps 200 -D "$attack_secs" --log-file="$tmp/normal.log" \
    -H ":authority: $host" "http://127.0.0.1:${h2c[$v]}/" 2>&1) || die "h2load failed against ${label[$v]}: $out"
  if [[ -n $att_pid ]]; then
    wait "$att_pid" || true
    summary=$(tr -d '\n' <"$tmp/attacker.txt")
  fi
  sort -t$'\t' -k3,3n "$tmp/normal.log" | awk -F'\t' -v v="$v" -v a="$attack" -v s="$summary" '
    { d[NR] = $3; if ($2 !~ /^2/) bad++ }
    END {
      if (NR == 0) { printf "rr\t%s\t%s\t0\t0\t0\t0\t0\t%s\n", v, a, s; exit }
      p50 = d[int((NR - 1) * 0.50) + 1]; p99 = d[int((NR - 1) * 0.99) + 1]
      printf "rr\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", v, a, p50, p99, d[NR], NR, bad + 0, s
    }' >>"$results"
  local line
  line=$(tail -n 1 "$results")
  IFS=$'\t' read -r _ _ _ _ _ _ total bad _ <<<"$line"
  if ((total == 0 || bad > 0)); then
    log "FAIL: the normal client of ${label[$v]} ($attack): $total requests, $bad not 2xx"
    failed=1
  fi
}

# Warm-up: connections, the upstream pool, the rate table.
for v in t n; do
  run_load "$v" h1 $((requests / 10 + 100)) warmup
  run_load "$v" h2 $((requests / 10 + 100)) warmup
done
for ((r = 1; r <= rounds; r++)); do
  for v in t n; do
    run_handshakes "$v" "$r"
    run_load "$v" h1 "$requests" record "$r"
    run_load "$v" h2 "$requests" record "$r"
    log "round $r/$rounds ${label[$v]}: $(grep -P "\t$v\t$r\t" "$results" | tr '\t\n' ' ;')"
  done
done
for v in t n; do
  run_normal "$v" none
  run_normal "$v" attack
  log "rapid reset ${label[$v]}: $(grep -P "^rr\t$v\t" "$results" | tr '\t\n' ' ;')"
done
resets=$(curl -s --max-time 5 "http://127.0.0.1:$t_metrics/metrics" |
  awk '/^tollgate_h2_reset_closes_total/ { print $2 }') || true
# ---------------------------------------------------------------------------------------
# Report.

echo
echo "## The edge against nginx: one worker each, loopback, same certificate (ECDSA P-256) and limits"
echo
echo "$("$bin" --version) links OpenSSL 3.6 (vendored); nginx $(nginx -v 2>&1 | sed 's/.*nginx\///') links $(openssl version | cut -d' ' -f1-2)."
echo "Handshakes agreed: tollgate ${agreed[t]}; nginx ${agreed[n]}."
echo "Medians over $rounds round(s); CPU = the proxy's utime+stime (nginx: master + worker) / work done."
echo
awk -F'\t' '
  function median(key,    a, n, i, j, t) {
    n = split(vals[key], a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function add(key, v) { vals[key] = vals[key] (vals[key] == "" ? "" : " ") v }
  $1 == "hs" { add("hs rate " $2, $4); add("hs cpu " $2, $5) }
  $1 == "h1" || $1 == "h2" { add($1 " rps " $2, $4); add($1 " cpu " $2, $5) }
  $1 == "rr" { rr[$2, $3] = sprintf("| %s | %s | %d | %.2f | %.2f | %.2f | %s |", $2 == "t" ? "tollgate" : "nginx", $3 == "attack" ? "under attack" : "alone", $7, $4 / 1000, $5 / 1000, $6 / 1000, $3 == "attack" ? $9 : "-") }
  END {
    print "| measure | tollgate | nginx | tollgate / nginx |"
    print "|---|---:|---:|---:|"
    ht = median("hs rate t"); hn = median("hs rate n"); ct = median("hs cpu t"); cn = median("hs cpu n")
    printf "| full TLS handshakes / s (s_time -new) | %.0f | %.0f | %.2f |\n", ht, hn, hn ? ht / hn : 0
    printf "| server CPU µs / full handshake | %.1f | %.1f | %.2f |\n", ct, cn, cn ? ct / cn : 0
    printf "| handshakes / CPU-second (one worker, saturated) | %.0f | %.0f | %.2f |\n", ct ? 1e6 / ct : 0, cn ? 1e6 / cn : 0, (ct && cn) ? cn / ct : 0
    split("h1 h2", ps, " ")
    name["h1"] = "HTTP/1.1 over TLS (h2load --h1 -c100)"; name["h2"] = "h2 over TLS (h2load -c10 -m10)"
    for (i = 1; i <= 2; i++) {
      p = ps[i]
      rt = median(p " rps t"); rn = median(p " rps n"); ct = median(p " cpu t"); cn = median(p " cpu n")
      printf "| %s req/s | %.0f | %.0f | %.2f |\n", name[p], rt, rn, rn ? rt / rn : 0
      printf "| %s CPU µs / request | %.2f | %.2f | %.2f |\n", name[p], ct, cn, cn ? ct / cn : 0
    }
    print ""
    print "### Rapid reset: a normal h2c client (h2load -c1 -m1 --rps 200) alone and under attack"
    print ""
    print "| proxy | normal client | requests | p50 ms | p99 ms | max ms | attacker (examples/rapid_reset) |"
    print "|---|---|---:|---:|---:|---:|---|"
    split("t n", vs, " ")
    for (i = 1; i <= 2; i++) for (j = 0; j < 2; j++) {
      k = vs[i] SUBSEP (j ? "attack" : "none")
      if (k in rr) print rr[k]
    }
  }' "$results"
echo
echo "tollgate_h2_reset_closes_total after the run: ${resets:-?}"
exit "$failed"
