#!/usr/bin/env python3
"""A stalled backend must not slow requests to the others (issue #15).

Started by `bash bench/run.sh --stalled` (which builds sluice and the bench
tools in release mode). Layout as bench/driver.py: sluice on core 0, load
and backends on core 1.

Two Services behind one sluice, by hostname: `ok.example` goes to the
bench backend (benches/backend.rs), `stalled.example` to a backend that
accepts connections and never answers. The open-loop load generator
(benches/loadgen.rs) sends a fixed rate to `ok.example` and its p99 is
measured three times, each in the same run of this script:

  alone     nothing else
  stalled   while a second load generator sends `stalled.example` a fixed
            rate too (those requests pile up to the backend's cap of
            requests in flight, then get 503 at once)
  no cap    the same with `--max-requests-per-backend 0` (requests to the
            stalled backend pile up until the backend timeout, 15 s)

Goal: the p99 of `ok.example` while the other backend stalls within 2x of
alone. The figures are timings on a shared machine: compare the rows of
one run, never runs of different days. Also printed: sluice's peak RSS
(the pile-up's memory) and the 503s the cap answered.

--quick: short phases; asserts only that every row produced numbers.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from driver import (LOAD_CPU, PROXY_CPU, free_port, http_get, log, status_kib,  # noqa: E402
                    stop, wait_until)
from manifests import gateway, route, service  # noqa: E402


def stalled_backend():
    """A listener that accepts and never answers; returns its port."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    held = []

    def accept():
        while True:
            conn, _ = listener.accept()
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def manifests(port, ok_port, stalled_port):
    out = gateway("bench", port)
    for name, target in (("ok", ok_port), ("stalled", stalled_port)):
        out += service(name, target) + route("bench", name, f"{name}.example", [(name, 1)])
    return out


def loadgen(exe, port, host, rate, seconds, connections):
    return subprocess.Popen(
        ["taskset", "-c", LOAD_CPU, exe, "run", "--url", f"http://127.0.0.1:{port}/",
         "--host", host, "--rate", str(rate), "--duration", str(seconds),
         "--connections", str(connections)],
        stdout=subprocess.PIPE, text=True)


def result_of(proc):
    out, _ = proc.communicate()
    return json.loads(out.strip().splitlines()[-1])


def rejected(admin):
    status, body = http_get(admin, "/metrics")
    if status != 200:
        return None
    for line in body.splitlines():
        if line.startswith("sluice_requests_rejected_total{") and "stalled" in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def phase(args, tools, name, cap, stalled_load):
    workdir = tempfile.mkdtemp(prefix="sluice-stalled-")
    port, admin = free_port(), free_port()
    backend = subprocess.Popen(["taskset", "-c", LOAD_CPU, tools["backend"], "serve",
                                f"127.0.0.1:{(ok_port := free_port())}"],
                               stdout=subprocess.PIPE, text=True)
    if backend.stdout.readline().strip() != "ready":
        raise RuntimeError("backend did not start")
    stalled_port = stalled_backend()
    with open(os.path.join(workdir, "all.yaml"), "w") as f:
        f.write(manifests(port, ok_port, stalled_port))
    cmd = [args.sluice, "serve", "-f", workdir, "--admin", f"127.0.0.1:{admin}",
           "--max-requests-per-backend", str(cap)]
    proxy = subprocess.Popen(["taskset", "-c", PROXY_CPU] + cmd,
                             env=dict(os.environ, RUST_LOG="warn"),
                             stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(workdir, "stderr.log"), "w"))
    try:
        wait_until(lambda: http_get(port, host="ok.example")[0] == 200, "sluice to answer")
        background = None
        if stalled_load:
            background = loadgen(tools["loadgen"], port, "stalled.example", args.stalled_rate,
                                 args.seconds + 2, args.stalled_connections)
            time.sleep(1)  # let the stalled backend's requests pile up first
        ok = result_of(loadgen(tools["loadgen"], port, "ok.example", args.rate, args.seconds,
                               50))
        row = {"phase": name, "cap": cap, "p50_us": ok["p50_us"], "p99_us": ok["p99_us"],
               "ok": ok["ok"], "failed": ok["failed"],
               "peak_rss_kib": status_kib([proxy.pid], "VmHWM"),
               "rejected_503": rejected(admin)}
        if background:
            stalled = result_of(background)
            row["stalled_sent"] = stalled["scheduled"]
        log(f"{name}: {row}")
        return row
    finally:
        stop(proxy)
        stop(backend)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sluice", required=True, help="release sluice binary")
    p.add_argument("--tools", required=True, help="JSON {backend, loadgen} executables")
    p.add_argument("--rate", type=int, default=2000, help="req/s to ok.example")
    p.add_argument("--stalled-rate", type=int, default=500, help="req/s to stalled.example")
    p.add_argument("--stalled-connections", type=int, default=1200)
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--cap", type=int, default=1024)
    args = p.parse_args()
    if args.quick:
        args.rate, args.stalled_rate, args.seconds = 500, 100, 3
        args.stalled_connections, args.cap = 200, 64
    tools = json.loads(args.tools)
    rows = [
        phase(args, tools, "alone", args.cap, False),
        phase(args, tools, "stalled", args.cap, True),
        phase(args, tools, "no cap", 0, True),
    ]
    print(f"{'phase':<10} {'cap':>5} {'p50 µs':>8} {'p99 µs':>8} {'ok':>7} {'failed':>6} "
          f"{'503s':>6} {'peak RSS MiB':>12}")
    for r in rows:
        print(f"{r['phase']:<10} {r['cap']:>5} {r['p50_us']:>8} {r['p99_us']:>8} {r['ok']:>7} "
              f"{r['failed']:>6} {r['rejected_503'] or 0:>6} {r['peak_rss_kib'] / 1024:>12.1f}")
    ratio = rows[1]["p99_us"] / max(rows[0]["p99_us"], 1)
    print(f"p99 of ok.example while stalled.example stalls: {ratio:.2f}x alone (goal: within 2x)")
    missing = [r["phase"] for r in rows if not r["ok"] or r["p99_us"] is None]
    if missing:
        print(f"no numbers for {missing}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
