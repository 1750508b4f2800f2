#!/usr/bin/env python3
"""A stalled backend must not slow requests to the others (issue #15).

Started by `bash bench/run.sh --stalled` (which builds sluice and the bench
tools in release mode). Layout as bench/driver.py: sluice on core 0, load
and backends on core 1.

Three Services behind one sluice, by hostname: `ok.example` and
`control.example` go to two bench backends (benches/backend.rs),
`stalled.example` to a backend that accepts connections and never answers.
The open-loop load generator (benches/loadgen.rs) sends a fixed rate to
`ok.example` and its p99 is measured in four phases, each in the same run
of this script:

  alone     nothing else
  control   while a second load generator sends `control.example` (a
            healthy backend) the stalled phase's rate on as many
            connections: the extra load and connections without a stall
  stalled   while the second load generator sends `stalled.example` that
            rate instead (those requests pile up to the backend's cap of
            requests in flight, then get 503 at once)
  no cap    the same with `--max-requests-per-backend 0` (requests to the
            stalled backend pile up until the client gives up, 5 s)

Goal: the p99 of `ok.example` while the other backend stalls within 2x of
alone. The control tells the cost of the stall from the cost of the extra
work on sluice's one core. The figures are timings on a shared machine:
compare the rows of one run, never runs of different days. Also printed:
sluice's CPU time per second of the phase (what the phase costs it, which
holds better than a p99 when other work shares the machine), the CPU time
per second of the load side (this script with the stalled backend, the
second load generator and the backends; not the measuring load
generator), how busy each core was, sluice's peak RSS (the pile-up's
memory) and the 503s the cap answered.

--baseline PATH: every phase also with that sluice binary, the two runs of
a phase back to back (paired A/B in one run; the order alternates by
round). --rounds N repeats the whole set. --perf DIR records a `perf`
profile of sluice during each measured phase into DIR.

--quick: short phases; asserts only that every row produced numbers.
"""

import argparse
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from driver import (CLK_TCK, LOAD_CPU, PROXY_CPU, cpu_ticks, free_port, http_get, log,  # noqa: E402
                    status_kib, stop, wait_until)
from manifests import gateway, route, service  # noqa: E402


def stalled_backend():
    """A listener that accepts and never answers, and closes a connection
    once sluice has closed it; returns its port and a function that stops
    it. Runs in this process, which main() pins to the load's core."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    done = threading.Event()

    def serve():
        while not done.is_set():
            for key, _ in sel.select(timeout=0.2):
                if key.fileobj is listener:
                    try:
                        conn, _ = listener.accept()
                    except BlockingIOError:
                        continue
                    conn.setblocking(False)
                    sel.register(conn, selectors.EVENT_READ)
                    continue
                try:
                    data = key.fileobj.recv(65536)  # the request: never answered
                except BlockingIOError:
                    continue
                except ConnectionError:
                    data = b""
                if not data:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        sel.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def stop_it():
        done.set()
        thread.join(timeout=5)

    return listener.getsockname()[1], stop_it


def manifests(port, targets):
    out = gateway("bench", port)
    for name, target in targets.items():
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


def core_times():
    """(busy, total) jiffies per core from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name != "cpu":
                v = [int(x) for x in fields]
                out[name[3:]] = (sum(v) - v[3] - v[4], sum(v))
    return out


def busy_percent(before, after, core):
    busy = after[core][0] - before[core][0]
    total = after[core][1] - before[core][1]
    return round(100 * busy / max(total, 1))


def bench_backend(tools):
    proc = subprocess.Popen(["taskset", "-c", LOAD_CPU, tools["backend"], "serve",
                             f"127.0.0.1:{(port := free_port())}"],
                            stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("backend did not start")
    return proc, port


def phase(args, tools, label, sluice, name, cap, other):
    """One measured phase: `other` is the host the second load generator
    sends to (None: no second load)."""
    workdir = tempfile.mkdtemp(prefix="sluice-stalled-")
    port, admin = free_port(), free_port()
    backend, ok_port = bench_backend(tools)
    control, control_port = bench_backend(tools)
    stalled_port, stop_stalled = stalled_backend()
    with open(os.path.join(workdir, "all.yaml"), "w") as f:
        f.write(manifests(port, {"ok": ok_port, "control": control_port,
                                 "stalled": stalled_port}))
    cmd = [sluice, "serve", "-f", workdir, "--admin", f"127.0.0.1:{admin}"]
    if cap is not None:
        cmd += ["--max-requests-per-backend", str(cap)]
    proxy = subprocess.Popen(["taskset", "-c", PROXY_CPU] + cmd,
                             env=dict(os.environ, RUST_LOG="warn"),
                             stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(workdir, "stderr.log"), "w"))
    perf = None
    try:
        for host in ("ok.example", "control.example"):
            try:
                wait_until(lambda: http_get(port, host=host)[0] == 200,
                           f"sluice to answer {host}", 60)
            except RuntimeError:
                with open(os.path.join(workdir, "stderr.log")) as f:
                    log(f"{label} {name}: sluice's log:\n{f.read()[-4000:]}")
                raise
        background = None
        if other:
            background = loadgen(tools["loadgen"], port, other, args.stalled_rate,
                                 args.seconds + 2, args.stalled_connections)
            time.sleep(1)  # let the second load (the stalled backend's pile-up) start first
        if args.perf:
            os.makedirs(args.perf, exist_ok=True)
            data = os.path.join(args.perf, f"{label}-{name.replace(' ', '-')}.data")
            perf = subprocess.Popen(["perf", "record", "-F", "999", "-g", "-o", data,
                                     "-p", str(proxy.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ticks = cpu_ticks([proxy.pid])
        load_side = [os.getpid()] + [p.pid for p in (background, backend, control) if p]
        load_ticks = cpu_ticks(load_side)
        cores = core_times()
        started = time.time()
        ok = result_of(loadgen(tools["loadgen"], port, "ok.example", args.rate, args.seconds,
                               50))
        elapsed = time.time() - started
        cpu_ms_per_s = (cpu_ticks([proxy.pid]) - ticks) * 1000 / CLK_TCK / elapsed
        # What the second load, its backend and the backends took of the
        # load's core (the measuring load generator not included).
        load_ms_per_s = (cpu_ticks(load_side) - load_ticks) * 1000 / CLK_TCK / elapsed
        cores_after = core_times()
        if perf:
            perf.send_signal(2)
            perf.wait(timeout=60)
        row = {"binary": label, "phase": name, "cap": "default" if cap is None else cap,
               "p50_us": ok["p50_us"], "p99_us": ok["p99_us"], "ok": ok["ok"],
               "failed": ok["failed"], "cpu_ms_per_s": round(cpu_ms_per_s),
               "load_ms_per_s": round(load_ms_per_s),
               "core0_busy": busy_percent(cores, cores_after, PROXY_CPU),
               "core1_busy": busy_percent(cores, cores_after, LOAD_CPU),
               "peak_rss_kib": status_kib([proxy.pid], "VmHWM"),
               "rejected_503": rejected(admin)}
        if background:
            second = result_of(background)
            row["second_sent"] = second["scheduled"]
            row["second_ok"] = second["ok"]
        log(f"{label} {name}: {row}")
        return row
    finally:
        if perf and perf.poll() is None:
            perf.kill()
        stop(proxy)
        stop(backend)
        stop(control)
        stop_stalled()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sluice", required=True, help="release sluice binary")
    p.add_argument("--baseline", help="another sluice binary, measured in the same run")
    p.add_argument("--tools", required=True, help="JSON {backend, loadgen} executables")
    p.add_argument("--rate", type=int, default=2000, help="req/s to ok.example")
    p.add_argument("--stalled-rate", type=int, default=500,
                   help="req/s to stalled.example (and to control.example)")
    p.add_argument("--stalled-connections", type=int, default=1200)
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--cap", type=int, help="--max-requests-per-backend (default: sluice's)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--phases", default="alone,control,stalled,no cap")
    p.add_argument("--perf", help="record a perf profile of each measured phase here")
    args = p.parse_args()
    if args.quick:
        args.rate, args.stalled_rate, args.seconds = 500, 100, 3
        args.stalled_connections, args.cap = 200, 64
    tools = json.loads(args.tools)
    # The stalled backend is a thread of this process: keep it (and the
    # load generators started from here) off sluice's core.
    os.sched_setaffinity(0, {int(LOAD_CPU)})
    binaries = [("after" if args.baseline else "sluice", args.sluice)]
    if args.baseline:
        binaries.insert(0, ("before", args.baseline))
    phases = {"alone": (args.cap, None), "control": (args.cap, "control.example"),
              "stalled": (args.cap, "stalled.example"), "no cap": (0, "stalled.example")}
    wanted = [n.strip() for n in args.phases.split(",")]
    rows = []
    for r in range(args.rounds):
        for name in wanted:
            cap, other = phases[name]
            for label, path in (binaries if r % 2 == 0 else binaries[::-1]):
                rows.append(phase(args, tools, label, path, name, cap, other))
    print(f"{'binary':<7} {'phase':<8} {'cap':>7} {'p50 µs':>7} {'p99 µs':>7} {'ok':>7} "
          f"{'failed':>6} {'503s':>6} {'CPU ms/s':>8} {'load ms/s':>9} {'core0 %':>7} {'core1 %':>7} "
          f"{'peak RSS MiB':>12}")
    for r in rows:
        print(f"{r['binary']:<7} {r['phase']:<8} {r['cap']:>7} {r['p50_us']:>7} {r['p99_us']:>7} "
              f"{r['ok']:>7} {r['failed']:>6} {r['rejected_503'] or 0:>6} "
              f"{r['cpu_ms_per_s']:>8} {r['load_ms_per_s']:>9} {r['core0_busy']:>7} {r['core1_busy']:>7} "
              f"{r['peak_rss_kib'] / 1024:>12.1f}")
    for label, _ in binaries:
        p99 = {}
        for name in wanted:
            values = [r["p99_us"] for r in rows if r["binary"] == label and r["phase"] == name]
            if values and None not in values:
                p99[name] = statistics.median(values)
        alone = max(p99.get("alone", 0), 1)
        ratios = ", ".join(f"{name} {v / alone:.2f}x" for name, v in p99.items()
                           if name != "alone")
        print(f"{label}: p99 of ok.example (median of rounds) against alone: {ratios} "
              f"(goal: stalled within 2x)")
    missing = [f"{r['binary']} {r['phase']}" for r in rows if not r["ok"] or r["p99_us"] is None]
    if missing:
        print(f"no numbers for {missing}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
