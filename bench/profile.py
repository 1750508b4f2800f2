#!/usr/bin/env python3
"""Per-request profiles of sluice binaries that hold on a loaded machine.

Two figures the CPU-time comparisons cannot give on a shared box:

  instructions  user-space instructions per request (valgrind callgrind,
                instrumentation switched on only around a wrk run), which
                repeat to within a percent or two whatever else runs
  wakeups       `sched:sched_waking` events in the proxy's context per
                request (perf stat): how often the proxy's writes wake the
                other side (wrk, the backend), each an IPI under KVM;
                with --event, that perf event instead (e.g.
                raw_syscalls:sys_enter: system calls per request)
  memory        heap per idle keep-alive client connection by allocation
                site (valgrind DHAT at the peak, 1,000 connections held
                after one request each; --mode https or h2c for those)

Same job as driver.py's closed-loop rows (995/5, wrk -t1 -c50, proxy on
core 0). Run it through bench/run.sh, which builds the tools:

    bash bench/run.sh --profile instructions before=/tmp/sluice-old after=target/dist/sluice
    bash bench/run.sh --profile wakeups --peers nginx,haproxy after=target/dist/sluice

`--mode h2c` drives the proxy with h2load (HTTP/2 with prior knowledge, 50
connections x 10 streams) instead of wrk; `--mode https` with wrk over TLS. With `--annotate DIR`,
callgrind's output and `callgrind_annotate`'s listing are kept in DIR.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import driver as d


def load(target, seconds):
    """Drive the proxy as its mode says."""
    if target.mode == "h2c":
        d.h2load(target.url(), seconds)
    else:
        d.wrk(target.port, seconds, target.url())


def instructions(target, seconds, keep):
    out_dir = tempfile.mkdtemp(prefix="sluice-callgrind-")
    out_file = f"{out_dir}/callgrind.out"
    target.wrapper = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                      f"--callgrind-out-file={out_file}"]
    target.start()
    try:
        load(target, 1)  # warm up: pooled connections made
        target.backends.reset()
        subprocess.run(["callgrind_control", "-i", "on", str(target.proc.pid)],
                       check=True, capture_output=True)
        load(target, seconds)
        subprocess.run(["callgrind_control", "-i", "off", str(target.proc.pid)],
                       check=True, capture_output=True)
        served = sum(target.backends.counts())
    finally:
        target.proc.send_signal(signal.SIGTERM)
        target.proc.wait(timeout=120)
        target.stop()
    total = None
    with open(out_file) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(out_file, f"{keep}/callgrind.out")
        listing = subprocess.run(["callgrind_annotate", "--inclusive=no", out_file],
                                 capture_output=True, text=True).stdout
        with open(f"{keep}/annotate.txt", "w") as f:
            f.write(listing)
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"requests": served, "instructions": total,
            "per_request": total / served if total and served else None}


def wakeups(target, seconds, event="sched:sched_waking"):
    target.start()
    try:
        load(target, 1)
        target.backends.reset()
        pids = ",".join(str(p) for p in target.pids())
        perf = subprocess.Popen(["perf", "stat", "-x,", "-e", event, "-p", pids],
                                stderr=subprocess.PIPE, text=True)
        load(target, seconds)
        perf.send_signal(signal.SIGINT)
        _, err = perf.communicate(timeout=30)
        served = sum(target.backends.counts())
    finally:
        target.stop()
    count = None
    for line in err.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2] == event:
            count = int(fields[0])
    return {"requests": served, "wakeups": count,
            "per_request": count / served if count is not None and served else None}


def memory(target, connections, keep):
    out_dir = tempfile.mkdtemp(prefix="sluice-dhat-")
    out_file = f"{out_dir}/dhat.json"
    target.wrapper = ["valgrind", "--tool=dhat", f"--dhat-out-file={out_file}"]
    target.start()
    socks = []
    try:
        socks = d.hold_connections(target, connections)
        # Idle as driver.py's `held` row measures it: past the second after
        # which sluice parks an idle connection off its task.
        time.sleep(2.5)
    finally:
        # The peak is with every connection held: stop before closing them.
        target.proc.send_signal(signal.SIGTERM)
        target.proc.wait(timeout=300)
        for s in socks:
            s.close()
        target.stop()
    listing = subprocess.run(["python3", os.path.join(os.path.dirname(__file__), "dhat_top.py"),
                              out_file, "--per", str(connections)],
                             capture_output=True, text=True).stdout
    print(listing)
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(out_file, f"{keep}/dhat.json")
    shutil.rmtree(out_dir, ignore_errors=True)
    first = listing.split()
    per = float(first[4].replace(",", "")) if len(first) > 4 else None
    return {"requests": connections, "per_request": per}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("instructions", "wakeups", "memory"))
    p.add_argument("--mode", default="http", choices=("http", "https", "h2c"))
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--tools", required=True, help="JSON {backend, ...} executables")
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--peers", default="", help="nginx,haproxy (wakeups only)")
    p.add_argument("--event", default="sched:sched_waking",
                   help="wakeups: count this perf event instead (raw_syscalls:sys_enter: syscalls)")
    p.add_argument("--annotate", help="keep callgrind's output and listing here (one binary)")
    p.add_argument("sluices", nargs="+", metavar="LABEL=PATH")
    a = p.parse_args()

    tools = json.loads(a.tools)
    if a.what == "memory":
        d.raise_fd_limit(a.connections)
    rows = [(label, "sluice", path) for label, path in (s.split("=", 1) for s in a.sluices)]
    if a.what == "wakeups":
        rows += [(peer, peer, None) for peer in a.peers.split(",") if peer]
    backends = d.Backends(tools["backend"])
    results = {}
    try:
        for round_ in range(a.rounds):
            for label, kind, path in rows:
                target = d.Proxy(kind, dict(tools, sluice=path), backends, (995, 5),
                                 mode=a.mode, held=a.connections if a.what == "memory" else 0)
                if a.what == "memory":
                    r = memory(target, a.connections, a.annotate)
                    unit = "heap bytes/connection"
                elif a.what == "instructions":
                    r = instructions(target, a.seconds, a.annotate)
                    unit = "instructions/req"
                else:
                    r = wakeups(target, a.seconds, a.event)
                    unit = "wake-ups/req" if a.event == "sched:sched_waking" else f"{a.event}/req"
                results.setdefault(label, []).append(r["per_request"])
                value = "-" if r["per_request"] is None else f"{r['per_request']:,.2f}"
                print(f"round {round_ + 1} {label:>12}: {value} {unit} "
                      f"({r['requests']} requests)", flush=True)
    finally:
        d.stop(backends.proc)
    for label, values in results.items():
        values = sorted(v for v in values if v is not None)
        if values:
            print(f"median {label:>12}: {values[len(values) // 2]:,.2f}")


if __name__ == "__main__":
    main()
