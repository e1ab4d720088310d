#!/usr/bin/env bash
# Measures `tollgate simulate` in log lines per second with the release binary, on a
# generated realistic log (scripts/gen-access-log.py, fixed seed) and the three-limit
# config benches/simulate.yaml (token bucket on client_ip, rate on customer, sliding log
# on client_ip + path). The replay is single-threaded: lines/s is per core.
#
#   benches/simulate.sh               # 2 M lines, both formats, best of 3 runs each
#   LINES=5000000 RUNS=5 benches/simulate.sh
#
# The figure is the binary's own (`lines_per_second` in --json: lines read over the wall
# time of reading, parsing and replaying, without loading the config or printing).
set -euo pipefail
cd "$(dirname "$0")/.."

LINES=${LINES:-2000000}
RUNS=${RUNS:-3}
OUT=target/simulate-bench
mkdir -p "$OUT"

if [[ ! -x target/release/tollgate || -n "${BUILD:-}" ]]; then
  cargo build --release --bin tollgate
fi

best() { # FILE FORMAT -> prints the best lines/s of $RUNS runs
  local file=$1 format=$2 best=0 rate
  for _ in $(seq "$RUNS"); do
    rate=$(target/release/tollgate simulate --config benches/simulate.yaml --log "$file" \
      --format "$format" --json | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["lines_per_second"]))')
    (( rate > best )) && best=$rate
  done
  echo "$best"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
for format in combined jsonl; do
  gen=$format; [[ $format == combined ]] && gen=vhost
  file="$OUT/access-$LINES.$format"
  if [[ ! -s $file ]]; then
    scripts/gen-access-log.py --lines "$LINES" --seed 1 --format "$gen" > "$file"
  fi
  size=$(du -m "$file" | cut -f1)
  rate=$(best "$file" "$format")
  printf '%-9s %9d lines (%4d MB): %9d lines/s (best of %d)\n' "$format" "$LINES" "$size" "$rate" "$RUNS"
done
