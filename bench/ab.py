#!/usr/bin/env python3
"""Paired A/B of sluice binaries: CPU per request next to nginx and HAProxy.

A change to the request path moves sluice's CPU per request by a microsecond
or two, less than the run-to-run noise of a shared machine. This compares
two (or more) sluice binaries in alternating rounds of the same job as
`driver.py`'s closed-loop rows (995/5, wrk -t1 -c50, proxy pinned to core 0),
with the peers in every round as the yardstick, and prints each round and the
medians. Run it through `bench/run.sh`, which builds the tools:

    cp target/dist/sluice /tmp/sluice-before     # before the change
    bash bench/run.sh --ab before=/tmp/sluice-before after=target/dist/sluice
"""
import argparse
import json

import driver as d


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tools", required=True, help="JSON {backend, loadgen} executables")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=int, default=6)
    p.add_argument("--peers", default="nginx,haproxy")
    p.add_argument("sluices", nargs="+", metavar="LABEL=PATH")
    a = p.parse_args()

    tools = json.loads(a.tools)
    rows = [(label, "sluice", path) for label, path in (s.split("=", 1) for s in a.sluices)]
    rows += [(peer, peer, None) for peer in a.peers.split(",") if peer]
    backends = d.Backends(tools["backend"])
    cpu, user, sys_, rps = {}, {}, {}, {}
    try:
        for round_ in range(a.rounds):
            for label, kind, path in rows:
                target = d.Proxy(kind, dict(tools, sluice=path), backends, (995, 5))
                try:
                    target.start()
                    d.wrk(target.port, 1)  # warm up keep-alive connections
                    r = d.measured(target, lambda: d.wrk(target.port, a.seconds))
                finally:
                    target.stop()
                cpu.setdefault(label, []).append(r["cpu_us_per_req"])
                user.setdefault(label, []).append(r["user_us_per_req"])
                sys_.setdefault(label, []).append(r["sys_us_per_req"])
                rps.setdefault(label, []).append(r["rps"])
                print(f"round {round_ + 1} {label:>12}: {r['cpu_us_per_req']:5.1f} us CPU/req "
                      f"({r['user_us_per_req']:5.1f} user, {r['sys_us_per_req']:5.1f} kernel), "
                      f"{r['rps']:8.0f} req/s, {r['errors']} errors", flush=True)
    finally:
        d.stop(backends.proc)
    def median(values):
        values = sorted(v for v in values if v is not None)
        return values[len(values) // 2] if values else None

    for label in cpu:
        c, u, s, q = (median(m[label]) for m in (cpu, user, sys_, rps))
        print(f"median {label:>12}: {c:5.1f} us CPU/req ({u:5.1f} user, {s:5.1f} kernel), "
              f"{q:8.0f} req/s" if c is not None else f"median {label:>12}: no numbers")


if __name__ == "__main__":
    main()
