#!/usr/bin/env bash
# Steady overload of `max: auto` (issue 23's first target), in one run on loopback: the
# origin of examples/capacity_drop.rs (C = 16 workers x 50 ms, the rest queue) keeps its
# capacity for the whole run.
#   1. unloaded: C/2 = 8 closed-loop clients, static max 1000: the origin's unloaded p99;
#   2. overload: 4 x C = 64 clients through `max: auto`, then through each static max of the
#      sweep C/2 .. 4C (8 16 24 32 48 64).
# Per run: the median over 250 ms ticks (the first 5 s left out) of goodput (200/s) and of
# the origin's p99 (time inside the origin: queue and service). Prints the table and the
# two ratios the issue sets: auto's goodput / the best static goodput (target >= 0.90) and
# auto's origin p99 / the unloaded p99 (target <= 1.5).
#
# Run:     TOLLGATE_BIN=target/release-plain/tollgate CD_PROFILE=release-plain \
#            nice benches/adaptive_steady.sh          (about 4 minutes after the build)
# Knobs:   AS_SECONDS (20)  AS_SWEEP ("8 16 24 32 48 64"), and capacity_drop.sh's
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${AS_SECONDS:-20}
sweep=${AS_SWEEP:-"8 16 24 32 48 64"}
out=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-steady.XXXXXX")
trap 'rm -rf "$out"' EXIT

CD_STEADY=1 CD_SECONDS=$seconds CD_CLIENTS=8 CD_MODES=1000 CD_OUT=$out/unloaded \
  "$root/benches/capacity_drop.sh"
CD_STEADY=1 CD_SECONDS=$seconds CD_CLIENTS=64 CD_MODES="auto $sweep" CD_OUT=$out/overload \
  "$root/benches/capacity_drop.sh"

python3 - "$out" <<'PY'
import csv, statistics, sys, pathlib
out = pathlib.Path(sys.argv[1])
def summary(path):
    rows = [r for r in csv.DictReader(open(path)) if float(r["t_s"]) > 5]
    med = lambda k: statistics.median(float(r[k]) for r in rows)
    return med("goodput_rps"), med("rejected_rps"), med("origin_p99_ms"), med("learned_max")
_, _, unloaded_p99, _ = summary(out / "unloaded" / "1000.csv")
print(f"unloaded (8 clients, static 1000): origin p99 {unloaded_p99:.1f} ms")
print("| max | goodput (200/s) | rejected/s | origin p99 (ms) | p99 / unloaded | learned max |")
print("|---|---:|---:|---:|---:|---:|")
runs = {}
for p in sorted((out / "overload").glob("*.csv"), key=lambda p: (p.stem != "auto", int(p.stem) if p.stem.isdigit() else 0)):
    g, r, p99, l = summary(p)
    runs[p.stem] = (g, p99)
    print(f"| {p.stem} | {g:.0f} | {r:.0f} | {p99:.1f} | {p99 / unloaded_p99:.2f} | {l if p.stem == 'auto' else '-'} |")
best = max((g, m) for m, (g, _) in runs.items() if m != "auto")
g_auto, p99_auto = runs["auto"]
print(f"auto goodput / best static (max {best[1]}): {g_auto / best[0]:.3f} (target >= 0.90)")
print(f"auto origin p99 / unloaded p99: {p99_auto / unloaded_p99:.2f} (target <= 1.5)")
PY
