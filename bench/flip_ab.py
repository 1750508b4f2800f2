#!/usr/bin/env python3
"""Paired A/B of sluice binaries on the flip row: weight flip visible after.

The flip row of `driver.py` (from the configuration write, or the API
server's watch event, to the first request served by the new table), for
two or more sluice binaries in one run: for each size (1 route, 100 and
10,000 more) and mode (file, `--kubernetes` with the tests' fake API
server), each round runs every binary in turn, so a loaded machine weighs
on all of them alike. Prints each run with the load average and the
median of each binary's run medians. Run it through `bench/run.sh`:

    cp target/dist/sluice /tmp/sluice-before     # before the change
    bash bench/run.sh --flip-ab before=/tmp/sluice-before after=target/dist/sluice
"""
import argparse
import json
import os
import statistics

import driver as d


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tools", required=True, help="JSON {backend, k8s_flip} executables")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--flips", type=int, default=10, help="flips per run")
    p.add_argument("--sizes", default="0,100,10000", help="more routes than the flipped one")
    p.add_argument("--modes", default="file,kubernetes")
    p.add_argument("--start-deadline", type=float, default=20.0,
                   help="seconds a proxy may take to answer after it starts (a loaded "
                        "machine needs more than 20 for 10,000 routes)")
    p.add_argument("sluices", nargs="+", metavar="LABEL=PATH")
    a = p.parse_args()

    if a.start_deadline != 20.0:
        wait_until = d.wait_until
        d.wait_until = lambda check, what, deadline_s=20.0: wait_until(
            check, what, max(deadline_s, a.start_deadline))
    tools = json.loads(a.tools)
    binaries = [s.split("=", 1) for s in a.sluices]
    backends = d.Backends(tools["backend"])
    medians = {}
    try:
        for mode in a.modes.split(","):
            for extra in (int(x) for x in a.sizes.split(",")):
                for round_ in range(a.rounds):
                    for label, path in binaries:
                        exes = dict(tools, sluice=path)
                        load = os.getloadavg()[0]
                        if mode == "file":
                            times, missed = d.flip_times("sluice", exes, backends, extra, a.flips)
                            median = statistics.median(times) if times else None
                        else:
                            row = d.k8s_flip_row(exes, extra, a.flips)
                            median, missed = row["median_ms"], row.get("missed", 0)
                        medians.setdefault((mode, extra, label), []).append(median)
                        print(f"{mode:>10} +{extra:>5} routes round {round_ + 1} {label:>8}: "
                              f"median {d.fmt(median, 1)} ms, {missed} missed, "
                              f"load average {load:.1f}", flush=True)
    finally:
        d.stop(backends.proc)
    print("\n| mode | more routes | " + " | ".join(label for label, _ in binaries) + " |")
    print("|---|---:|" + "---:|" * len(binaries))
    for mode in a.modes.split(","):
        for extra in (int(x) for x in a.sizes.split(",")):
            cells = []
            for label, _ in binaries:
                values = [v for v in medians.get((mode, extra, label), []) if v is not None]
                cells.append(d.fmt(statistics.median(values), 1) if values else "-")
            print(f"| {mode} | {extra:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
