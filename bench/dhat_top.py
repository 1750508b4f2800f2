#!/usr/bin/env python3
"""The allocation sites holding the most heap at a DHAT profile's peak.

    valgrind --tool=dhat --dhat-out-file=dhat.json target/dist/sluice serve ...
    python3 bench/dhat_top.py dhat.json [--per N] [--top 25]

Prints, per allocation site (its innermost frames in sluice's, hyper's,
tokio's or rustls' code), the bytes and blocks live at the global peak
(t-gmax), divided by --per (the number of held connections) when given.
bench/run.sh --profile memory runs it (see bench/profile.py).
"""
import argparse
import json

INTERESTING = ("sluice", "hyper", "tokio", "rustls", "h2::", "http::", "bytes::")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--per", type=int, default=1)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    with open(a.file) as f:
        d = json.load(f)
    frames = d["ftbl"]
    sites = {}
    for pp in d["pps"]:
        gb, gbk = pp.get("gb", 0), pp.get("gbk", 0)
        if not gb:
            continue
        names = [frames[i] for i in pp["fs"]]
        useful = [n for n in names if any(k in n for k in INTERESTING)][:4]
        key = " <- ".join(short(n) for n in useful) or short(names[0])
        b, k = sites.get(key, (0, 0))
        sites[key] = (b + gb, k + gbk)
    total = sum(b for b, _ in sites.values())
    print(f"live at the peak: {total / a.per:,.0f} bytes" + (f" per connection ({a.per})" if a.per > 1 else ""))
    for key, (b, k) in sorted(sites.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print(f"{b / a.per:10,.0f} B {k / a.per:7.2f} blocks  {key}")


def short(frame):
    # "0x1234: fn_name (file.rs:12:3)" -> "fn_name (file.rs:12)"
    text = frame.split(": ", 1)[-1]
    return text.replace("core::ptr::drop_in_place", "drop")[:140]


if __name__ == "__main__":
    main()
