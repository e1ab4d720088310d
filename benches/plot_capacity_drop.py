#!/usr/bin/python3
"""Draws the capacity-drop run (benches/capacity_drop.sh): learned max, goodput and the
origin's p99 over time, one line per `max` tried, into an SVG; prints a per-phase table
(markdown) for docs/performance.md.

plot_capacity_drop.py CSV_DIR OUT.svg
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src, out = sys.argv[1], sys.argv[2]
runs = {}
for name in sorted(os.listdir(src)):
    if name.endswith(".csv"):
        with open(os.path.join(src, name)) as f:
            runs[name[:-4]] = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
order = [m for m in ("auto", "16", "64") if m in runs] + [m for m in runs if m not in ("auto", "16", "64")]
label = {m: ("max: auto" if m == "auto" else f"max: {m}") for m in order}

fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
for m in order:
    rows = runs[m]
    t = [r["t_s"] for r in rows]
    if m == "auto":
        axes[0].plot(t, [r["learned_max"] for r in rows], label="learned max")
    axes[1].plot(t, [r["goodput_rps"] for r in rows], label=label[m])
    axes[2].plot(t, [r["origin_p99_ms"] for r in rows], label=label[m])
end = max(r["t_s"] for rows in runs.values() for r in rows)
for ax in axes:
    for x in (end / 3, 2 * end / 3):
        ax.axvline(x, color="grey", linestyle=":", linewidth=1)
axes[0].axhline(16, color="grey", linewidth=0.8, linestyle="--")
axes[0].axhline(8, color="grey", linewidth=0.8, linestyle="--")
axes[0].set_ylabel("learned max")
axes[0].set_title("Origin of 16 workers x 50 ms, halved from 1/3 to 2/3 of the run; 48 clients")
axes[1].set_ylabel("goodput (200/s)")
axes[2].set_ylabel("origin p99 (ms)")
axes[2].set_yscale("log")
axes[2].set_xlabel("time (s)")
for ax in axes:
    ax.legend(loc="upper right", fontsize=8)
fig.tight_layout()
fig.savefig(out)

# The table: each phase without its first 5 s (the transition), medians of the 250 ms ticks.
def med(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")

phases = [("before the drop", 5, end / 3), ("capacity halved", end / 3 + 5, 2 * end / 3),
          ("recovered", 2 * end / 3 + 5, end + 1)]
print("| max | phase | goodput (200/s) | rejected/s | origin p99 (ms) | learned max |")
print("|---|---|---:|---:|---:|---:|")
for m in order:
    for name, a, b in phases:
        rows = [r for r in runs[m] if a <= r["t_s"] < b]
        learned = f'{med([r["learned_max"] for r in rows]):.0f}' if m == "auto" else "-"
        print(f'| {label[m]} | {name} | {med([r["goodput_rps"] for r in rows]):.0f} | '
              f'{med([r["rejected_rps"] for r in rows]):.0f} | '
              f'{med([r["origin_p99_ms"] for r in rows]):.1f} | {learned} |')
if "auto" in runs:
    drop = end / 3
    halved = med([r["learned_max"] for r in runs["auto"] if drop + 5 <= r["t_s"] < 2 * drop])
    after = [r for r in runs["auto"] if r["t_s"] >= drop]
    settled = next((r["t_s"] - drop for r in after if r["learned_max"] <= halved * 1.2), None)
    print(f"\nlearned max within 20% of its settled value after the drop ({halved:.0f}): {settled} s")
