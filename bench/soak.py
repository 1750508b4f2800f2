#!/usr/bin/env python3
"""Soak: mixed load on one sluice for a long time (issue #15).

Started by `bash bench/run.sh --soak [--minutes N]` (30 by default; `--quick`
runs 20 seconds, CI's smoke test of the script). sluice runs on core 0, the
load and the backends on core 1, as in bench/driver.py.

The load, all at once for the whole run:

  keep-alive   the open-loop load generator (benches/loadgen.rs), 300 req/s
               on 20 keep-alive connections to `split.example`
  new conns    20 req/s, each on a new connection: GETs and small POSTs
               (256-byte bodies) to `split.example`
  websocket    one WebSocket a second to `ws.example`: upgraded, a frame
               sent and echoed back, closed
  flips        `split.example`'s weights flipped (90/10 <-> 10/90) every 5 s
               by rewriting the route's file
  flapping     `flap.example`'s backend is stopped for 5 s every 15 s while
               10 req/s (new connections) go to it

Reported: failed requests per kind (goal: 0 everywhere but `flapping`,
whose errors are the backend's own), and sluice's RSS and open file
descriptors every 5 s (goal: flat: the last minute's no higher than the
first minute's after warm-up, beyond noise).
"""

import argparse
import base64
import hashlib
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
from manifests import gateway, route, service, write  # noqa: E402

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def ws_backend():
    """A WebSocket backend: answers the upgrade, then echoes every byte."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)

    def serve(conn):
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            key = b""
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"sec-websocket-key:"):
                    key = line.split(b":", 1)[1].strip()
            accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            while True:
                data = conn.recv(4096)
                if not data:
                    return
                conn.sendall(data)

    def accept():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def websocket_once(port):
    key = base64.b64encode(os.urandom(16))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: ws.example\r\nConnection: Upgrade\r\n"
                  b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: "
                  + key + b"\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                return False
            head += chunk
        head, _, rest = head.partition(b"\r\n\r\n")
        want = base64.b64encode(hashlib.sha1(key + GUID).digest())
        if not head.startswith(b"HTTP/1.1 101") or want not in head:
            return False
        payload = os.urandom(32)
        mask = os.urandom(4)
        frame = bytes([0x82, 0x80 | len(payload)]) + mask + bytes(
            b ^ mask[i % 4] for i, b in enumerate(payload))
        s.sendall(frame)
        echoed = rest
        while len(echoed) < len(frame):
            chunk = s.recv(4096)
            if not chunk:
                return False
            echoed += chunk
        return echoed == frame


def one_request(port, host, post):
    """One request on a new connection: whether it got a 2xx, and if not why
    (the status line sluice answered, or what the socket said)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            if post:
                body = b"x" * 256
                s.sendall(f"POST /soak HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}"
                          "\r\nConnection: close\r\n\r\n".encode() + body)
            else:
                s.sendall(f"GET /soak HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                          .encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        if data.startswith(b"HTTP/1.1 2"):
            return True, None
        return False, data.split(b"\r\n", 1)[0].decode(errors="replace") or "closed, no answer"
    except OSError as e:
        return False, type(e).__name__


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = {}
        self.failed = {}

        self.why = {}

    def add(self, kind, ok, why=None):
        with self.lock:
            self.sent[kind] = self.sent.get(kind, 0) + 1
            if not ok:
                self.failed[kind] = self.failed.get(kind, 0) + 1
                key = (kind, why or "failed")
                self.why[key] = self.why.get(key, 0) + 1


def paced(every, until, body):
    """Call body() every `every` seconds until `until` (time.monotonic())."""
    next_at = time.monotonic()
    while time.monotonic() < until:
        body()
        next_at += every
        time.sleep(max(0.0, next_at - time.monotonic()))


def fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="20 seconds (CI smoke)")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--sluice", required=True, help="release sluice binary")
    p.add_argument("--tools", required=True, help="JSON {backend, loadgen} executables")
    p.add_argument("--out", help="also write the samples and totals here (JSON)")
    args = p.parse_args()
    seconds = 20 if args.quick else int(args.minutes * 60)
    tools = json.loads(args.tools)
    workdir = tempfile.mkdtemp(prefix="sluice-soak-")
    port, admin = free_port(), free_port()
    stable, canary, flappy = free_port(), free_port(), free_port()
    backends = subprocess.Popen(["taskset", "-c", LOAD_CPU, tools["backend"], "serve",
                                 f"127.0.0.1:{stable}", f"127.0.0.1:{canary}"],
                                stdout=subprocess.PIPE, text=True)
    if backends.stdout.readline().strip() != "ready":
        raise RuntimeError("backends did not start")
    ws = ws_backend()
    write(os.path.join(workdir, "base.yaml"),
          gateway("soak", port) + service("stable", stable) + service("canary", canary)
          + service("flappy", flappy) + service("ws", ws)
          + route("soak", "flap", "flap.example", [("flappy", 1)])
          + route("soak", "ws", "ws.example", [("ws", 1)]))
    split_file = os.path.join(workdir, "split.yaml")
    write(split_file, route("soak", "split", "split.example", [("stable", 90), ("canary", 10)]).lstrip("-\n"))
    proxy = subprocess.Popen(["taskset", "-c", PROXY_CPU, args.sluice, "serve", "-f", workdir,
                              "--admin", f"127.0.0.1:{admin}"],
                             env=dict(os.environ, RUST_LOG="warn"), stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(workdir, "stderr.log"), "w"))
    flap_proc = [None]

    def flap_up():
        flap_proc[0] = subprocess.Popen(["taskset", "-c", LOAD_CPU, tools["backend"], "serve",
                                         f"127.0.0.1:{flappy}"], stdout=subprocess.PIPE,
                                        text=True)
        flap_proc[0].stdout.readline()

    def flap_down():
        if flap_proc[0]:
            flap_proc[0].kill()
            flap_proc[0].wait()
            flap_proc[0] = None

    counts = Counts()
    samples = []
    try:
        flap_up()
        wait_until(lambda: http_get(port, host="split.example")[0] == 200, "sluice to answer")
        start = time.monotonic()
        until = start + seconds
        log(f"soak: {seconds} s, sluice pid {proxy.pid}, files in {workdir}")
        keepalive = subprocess.Popen(
            ["taskset", "-c", LOAD_CPU, tools["loadgen"], "run",
             "--url", f"http://127.0.0.1:{port}/", "--host", "split.example",
             "--rate", "300", "--duration", str(seconds), "--connections", "20"],
            stdout=subprocess.PIPE, text=True)
        post = [False]

        def new_conn():
            post[0] = not post[0]
            counts.add("new conns", *one_request(port, "split.example", post[0]))

        flip = [False]

        def flip_weights():
            flip[0] = not flip[0]
            w = (10, 90) if flip[0] else (90, 10)
            write(split_file, route("soak", "split", "split.example",
                                    [("stable", w[0]), ("canary", w[1])]).lstrip("-\n"))
            counts.add("flips", True)

        tick = [0]

        def flapping():
            # 15 s cycle: down for the last 5 s.
            tick[0] += 1
            if tick[0] % 15 == 10:
                flap_down()
            elif tick[0] % 15 == 0:
                flap_up()

        def sample():
            samples.append({"t": round(time.monotonic() - start),
                            "rss_kib": status_kib([proxy.pid], "VmRSS"),
                            "fds": fds(proxy.pid)})

        def websocket():
            try:
                ok = websocket_once(port)
            except OSError as e:
                ok = e
            counts.add("websocket", ok is True, None if ok is True else
                       type(ok).__name__ if isinstance(ok, OSError) else "bad upgrade or echo")

        def flap_request():
            counts.add("flapping", *one_request(port, "flap.example", False))

        jobs = [(0.05, new_conn), (1.0, websocket), (5.0, flip_weights), (1.0, flapping),
                (0.1, flap_request), (5.0, sample)]
        threads = [threading.Thread(target=paced, args=(every, until, job))
                   for every, job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out, _ = keepalive.communicate()
        ka = json.loads(out.strip().splitlines()[-1])
        counts.sent["keep-alive"] = ka["scheduled"]
        counts.failed["keep-alive"] = ka["failed"]
        for why in ("connect_failed", "closed", "timed_out", "non_2xx"):
            if ka.get(why):
                counts.why[("keep-alive", why)] = ka[why]
        sample()
        # What sluice itself answered on the split route, by status code: a
        # failure the clients saw that sluice did not answer as an error is
        # the client's or the machine's (a timeout under load), not sluice's.
        codes = {}
        try:
            with socket.create_connection(("127.0.0.1", admin), timeout=5) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
                text = b""
                while chunk := s.recv(65536):
                    text += chunk
            for line in text.decode(errors="replace").splitlines():
                if line.startswith("sluice_requests_total{") and 'route="default/split"' in line:
                    code = line.split('code="', 1)[1].split('"', 1)[0]
                    codes[code] = codes.get(code, 0) + int(float(line.rsplit(" ", 1)[1]))
        except (OSError, IndexError, ValueError) as e:
            codes = {"unread": str(e)}
    finally:
        flap_down()
        stop(proxy)
        stop(backends)

    print(f"soak: {seconds} s")
    print(f"{'load':<12} {'sent':>9} {'failed':>7}")
    for kind in ("keep-alive", "new conns", "websocket", "flips", "flapping"):
        print(f"{kind:<12} {counts.sent.get(kind, 0):>9} {counts.failed.get(kind, 0):>7}")
    print(f"{'t (s)':>6} {'RSS MiB':>8} {'fds':>5}")
    step = max(1, len(samples) // 12)
    for s in samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else []):
        print(f"{s['t']:>6} {s['rss_kib'] / 1024:>8.1f} {s['fds'] if s['fds'] is not None else '-':>5}")
    for (kind, why), n in sorted(counts.why.items()):
        print(f"  {kind}: {n} {why}")
    print(f"sluice's answers on split.example by status code: {codes}")
    failed_outside = sum(v for k, v in counts.failed.items() if k != "flapping")
    print(f"failed outside the flapping backend: {failed_outside} (goal 0)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"seconds": seconds, "sent": counts.sent, "failed": counts.failed,
                       "why": {f"{k}: {w}": n for (k, w), n in counts.why.items()},
                       "sluice_codes": codes,
                       "samples": samples}, f, indent=1)
    if not samples or not counts.sent.get("keep-alive"):
        print("no numbers", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
