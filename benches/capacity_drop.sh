#!/usr/bin/env bash
# The capacity-drop run of `max: auto` (issue 23; docs/performance.md): an origin of 16
# workers x 20 ms (examples/capacity_drop.rs) loses half its workers at a third of the
# run and gets them back at two thirds, while 48 closed-loop clients go through tollgate.
# Run once per max: `auto`, then static 16 (the best static max before the drop) and 64
# (an operator's generous guess). Each run writes docs/capacity_drop/MODE.csv (one line per
# 250 ms: learned max, goodput, rejections, origin p99); benches/plot_capacity_drop.py
# draws docs/capacity_drop.svg from them and prints the per-phase table.
#
# Run:     benches/capacity_drop.sh            (about 2 minutes after the build)
# Knobs:   CD_SECONDS (30)  CD_CLIENTS (48)  CD_MODES ("auto 16 64")  TOLLGATE_BIN
#          CD_STEADY (1: the origin keeps its capacity, no drop; no plot)
#          CD_OUT (where the CSVs go, docs/capacity_drop)  CD_PROFILE (the example's cargo
#          profile, dev; release-plain for a release measurement)
# benches/adaptive_steady.sh runs it for the steady-overload sweep.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${CD_SECONDS:-30}
clients=${CD_CLIENTS:-48}
modes=${CD_MODES:-"auto 16 64"}
steady=${CD_STEADY:-0}
profile=${CD_PROFILE:-dev}
out=${CD_OUT:-$root/docs/capacity_drop}
mkdir -p "$out"
cd "$root"
cargo build -q --profile "$profile" --example capacity_drop
example_dir=$root/target/$([ "$profile" = dev ] && echo debug || echo "$profile")/examples
bin=${TOLLGATE_BIN:-$root/target/debug/tollgate}
[ -x "$bin" ] || { cargo build -q; bin=$root/target/debug/tollgate; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

for mode in $modes; do
  proxy=$(free_port); metrics=$(free_port); origin=$(free_port)
  if [ "$mode" = auto ]; then max="{auto: {min: 2, max: 1000, initial: 8}}"; else max=$mode; fi
  dir=$(mktemp -d)
  cat > "$dir/tollgate.yaml" <<YAML
server:
  listen: ["127.0.0.1:$proxy"]
  metrics: "127.0.0.1:$metrics"
  threads: 2
origins:
  bench:
    hosts: [bench.test]
    upstreams: ["127.0.0.1:$origin"]
    limits:
      conc:
        kind: inflight
        key: [server_ip]
        max: $max
YAML
  "$bin" run -c "$dir/tollgate.yaml" > "$dir/log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$metrics/metrics" > /dev/null && break
    sleep 0.1
  done
  echo "capacity_drop: max $mode" >&2
  "$example_dir/capacity_drop" "127.0.0.1:$proxy" "127.0.0.1:$metrics" \
    "$origin" "$clients" "$seconds" $([ "$steady" = 1 ] && echo steady) > "$out/$mode.csv"
  kill "$pid"; wait "$pid" 2> /dev/null || true
  rm -rf "$dir"
done
if [ "$steady" != 1 ]; then
  ${PLOT_PYTHON:-/usr/bin/python3} "$root/benches/plot_capacity_drop.py" "$out" "$root/docs/capacity_drop.svg"
fi
