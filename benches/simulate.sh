#!/usr/bin/env bash
# Measures `tollgate simulate` in log lines per second with the release binary, on a
# generated realistic log (scripts/gen-access-log.py, fixed seed) and the three-limit
# config benches/simulate.yaml (token bucket on client_ip, rate on customer, sliding log
# on client_ip + path). The replay is single-threaded: lines/s is per core.
#
#   benches/simulate.sh               # 2 M lines, both formats, best of 3 runs each
#   LINES=5000000 RUNS=5 benches/simulate.sh
#
# Two figures: the binary's own (`lines_per_second` in --json: lines over the wall time of
# reading, parsing and replaying, without loading the config or printing), and lines per
# CPU second of the whole process (user + system, from getrusage), which a busy machine
# distorts less.
set -euo pipefail
cd "$(dirname "$0")/.."

LINES=${LINES:-2000000}
RUNS=${RUNS:-3}
OUT=target/simulate-bench
mkdir -p "$OUT"

if [[ ! -x target/release/tollgate || -n "${BUILD:-}" ]]; then
  cargo build --release --bin tollgate
fi

# FILE FORMAT -> the best wall-clock and the best CPU lines/s of $RUNS runs.
best() {
  python3 - "$1" "$2" "$RUNS" <<'PY'
import json, resource, subprocess, sys
log, fmt, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
best = best_cpu = 0
for _ in range(runs):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        ["target/release/tollgate", "simulate", "--config", "benches/simulate.yaml",
         "--log", log, "--format", fmt, "--json"], check=True, capture_output=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = json.loads(out)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    best = max(best, int(report["lines_per_second"]))
    best_cpu = max(best_cpu, int(report["input"]["lines"] / cpu))
print(best, best_cpu)
PY
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
for format in combined jsonl; do
  gen=$format
  [[ $format == combined ]] && gen=vhost
  file="$OUT/access-$LINES.$format"
  if [[ ! -s $file ]]; then
    scripts/gen-access-log.py --lines "$LINES" --seed 1 --format "$gen" > "$file"
  fi
  size=$(du -m "$file" | cut -f1)
  read -r rate cpu < <(best "$file" "$format")
  printf '%-9s %9d lines (%4d MB): %9d lines/s wall, %9d lines per CPU second (best of %d)\n' \
    "$format" "$LINES" "$size" "$rate" "$cpu" "$RUNS"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
