#!/usr/bin/env python3
"""Writes a realistic, deterministic access log for `tollgate simulate` tests and benches.

Same seed, same arguments: same bytes. Traffic is a steady base rate with Poisson arrivals
plus bursts, clients drawn from a skewed (Zipf-like) population so that a few heavy hitters
stand out, a customer header on API paths, and a few hosts.

    scripts/gen-access-log.py --lines 1000000 --format combined > access.log
    scripts/gen-access-log.py --lines 500 --format jsonl --seed 7 > access.jsonl

Options: --lines N, --format combined|vhost|jsonl, --seed S, --rate R (mean requests per
second), --start UNIX_SECONDS, --clients N, --hosts a,b,c.
"""

import argparse
import json
import random
import sys
import time

PATHS = [
    ("GET", "/"), ("GET", "/products"), ("GET", "/products/{n}"), ("GET", "/cart"),
    ("POST", "/cart/items"), ("GET", "/api/v1/items?page={n}"), ("GET", "/api/v1/items/{n}"),
    ("POST", "/api/v1/orders"), ("GET", "/static/app.{n}.js"), ("GET", "/healthz"),
]
AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148",
    "curl/8.5.0", "python-requests/2.31.0", "Go-http-client/2.0",
]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def clf_time(t):
    g = time.gmtime(int(t))
    return "%02d/%s/%04d:%02d:%02d:%02d +0000" % (
        g.tm_mday, MONTHS[g.tm_mon - 1], g.tm_year, g.tm_hour, g.tm_min, g.tm_sec)


def iso_time(t):
    # Whole milliseconds, truncated: never rounded up into the next second.
    ms_total = int(t * 1000)
    g = time.gmtime(ms_total // 1000)
    ms = ms_total % 1000
    return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (
        g.tm_year, g.tm_mon, g.tm_mday, g.tm_hour, g.tm_min, g.tm_sec, ms)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lines", type=int, default=1000)
    p.add_argument("--format", choices=["combined", "vhost", "jsonl"], default="combined")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--start", type=float, default=1_790_000_000.0)
    p.add_argument("--clients", type=int, default=5000)
    p.add_argument("--hosts", default="shop.example.com,api.example.com")
    a = p.parse_args()
    rng = random.Random(a.seed)
    hosts = a.hosts.split(",")
    clients = ["10.%d.%d.%d" % (i >> 16 & 255, i >> 8 & 255, i & 255) for i in range(1, a.clients + 1)]
    customers = ["cust-%03d" % i for i in range(1, 51)]
    out = sys.stdout
    t = a.start
    burst = 0
    for _ in range(a.lines):
        # Bursts: now and then one second at 10x the rate.
        if burst == 0 and rng.random() < 0.0005:
            burst = int(a.rate * 10)
        rate = a.rate * (10 if burst else 1)
        burst = max(0, burst - 1)
        t += rng.expovariate(rate)
        # Skewed clients: the first few addresses are heavy hitters.
        ip = clients[min(int((rng.paretovariate(1.2) - 1) * 40), len(clients) - 1)]
        method, path = rng.choice(PATHS)
        path = path.replace("{n}", str(rng.randint(1, 500)))
        host = hosts[0] if not path.startswith("/api") else hosts[-1]
        status = rng.choice([200] * 30 + [304, 404, 302, 500])
        size = rng.randint(0, 50000)
        agent = rng.choice(AGENTS)
        customer = customers[min(int((rng.paretovariate(1.2) - 1) * 5), len(customers) - 1)]
        referer = "https://%s/" % hosts[0] if rng.random() < 0.5 else "-"
        if a.format == "jsonl":
            rec = {
                "time": iso_time(t), "remote_addr": ip, "host": host, "method": method,
                "path": path, "status": status, "bytes": size, "request_time": round(rng.expovariate(20), 3),
                "headers": {"user-agent": agent},
            }
            if path.startswith("/api"):
                rec["headers"]["x-customer-id"] = customer
            if referer != "-":
                rec["headers"]["referer"] = referer
            out.write(json.dumps(rec, separators=(",", ":")) + "\n")
        else:
            prefix = "%s:443 " % host if a.format == "vhost" else ""
            out.write('%s%s - - [%s] "%s %s HTTP/1.1" %d %d "%s" "%s"\n' % (
                prefix, ip, clf_time(t), method, path, status, size, referer, agent))


if __name__ == "__main__":
    main()
