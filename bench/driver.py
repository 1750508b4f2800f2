#!/usr/bin/env python3
"""sluice next to nginx and HAProxy on the same box, same job, same run.

Started by bench/run.sh (which installs nginx, HAProxy and wrk and builds
everything); see docs/performance.md for what each number means.

Layout: the proxy under test is pinned to core 0, the load generator and
the backends to core 1. The backends are our own tiny server
(benches/backend.rs) that counts what each receives.

Runs, in order:
  closed loop  wrk -t1 -c50 per proxy and split (995/5, 90/10), plus the
               backend alone; median of three runs per row
  fixed rate   5,000 req/s open loop (benches/loadgen.rs), latency from the
               scheduled send time
  reload       weights flipped ten times under load with each proxy's own
               reload; every failed request counted
  protocols    CPU per request over HTTPS keep-alive, HTTPS with a TLS
               handshake per request (wrk), and h2c (h2load -c50 -m10)
  held         RSS with no client connection and with N idle keep-alive
               connections held (5,000; --held N), per proxy and protocol;
               a second request on each must succeed
  flip         weight flip visible after: configuration written (plus the
               peer's reload) to the first request served by it; sluice
               also with 100 and 10,000 routes in the table
  scale        parse/translate time, RSS and match time for 1k/10k/50k routes
  rebuild      p99 and errors while the table of 10,000 routes is rebuilt
               every 100 ms; RSS after 1,000 rebuilds vs after the first
  cores        (only with --only cores) requests per second with the proxy
               on one core and on two (load generator on the same two)

--quick: one short run of each, small scale; asserts only that every row
produced numbers (never a timing). Exit status 1 when a row has none.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROXY_CPU = "0"
LOAD_CPU = "1"
# Worker processes (nginx) or threads (HAProxy; sluice takes one per core
# it may run on) and wrk's threads: 1 except in the `cores` suite.
PROXY_WORKERS = 1
WRK_THREADS = 1


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port, path="/", host="127.0.0.1", timeout=1.0, tls=False):
    """Status and body of one GET (over TLS, certificate not verified, when
    `tls`), or (None, error)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
            s = insecure_tls().wrap_socket(raw) if tls else raw
            s.sendall(f"GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n".encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        return status, body.decode(errors="replace")
    except (OSError, ValueError, IndexError) as e:
        return None, str(e)


def insecure_tls():
    """A client TLS context that accepts the bench's self-signed certificate."""
    import ssl
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


_TLS = {}


def tls_files():
    """A self-signed ECDSA P-256 certificate for 127.0.0.1, made once per run."""
    if not _TLS:
        d = tempfile.mkdtemp(prefix="sluice-bench-tls-")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{d}/key.pem",
                        "-out", f"{d}/cert.pem", "-days", "2", "-subj", "/CN=bench.example",
                        "-addext", "subjectAltName=DNS:bench.example,IP:127.0.0.1"],
                       check=True, capture_output=True)
        # PKCS#8 "BEGIN PRIVATE KEY" is what every proxy here reads.
        _TLS["cert"], _TLS["key"] = f"{d}/cert.pem", f"{d}/key.pem"
    return _TLS["cert"], _TLS["key"]


def b64file(path):
    import base64
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def generated_routes(n):
    """`n` HTTPRoutes on hostnames the bench never asks for (the table size)."""
    out = []
    for i in range(n):
        out.append(f"""apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: extra-{i}, namespace: default}}
spec:
  parentRefs: [{{name: bench}}]
  hostnames: [host-{i // 10}.example.com]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /r{i}}}}}]
    backendRefs: [{{name: stable, port: 80}}]
""")
    return "---\n".join(out)


def wait_until(check, what, deadline_s=20.0):
    end = time.time() + deadline_s
    while time.time() < end:
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


# ---------------------------------------------------------------- processes


def children_of(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid:
            kids.append(int(entry))
    return kids


def tree(pid):
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo.extend(children_of(p))
    return pids


def cpu_ticks(pids):
    """utime + stime of the processes (all their threads), in clock ticks."""
    return sum(cpu_split(pids))


def cpu_split(pids):
    """(utime, stime) of the processes (all their threads), in clock ticks."""
    user = system = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        user += int(fields[11])
        system += int(fields[12])
    return user, system


def status_kib(pids, field):
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def stop(proc):
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ backend


class Backends:
    def __init__(self, exe):
        self.stable, self.canary = free_port(), free_port()
        self.proc = subprocess.Popen(
            ["taskset", "-c", LOAD_CPU, exe, "serve",
             f"127.0.0.1:{self.stable}", f"127.0.0.1:{self.canary}"],
            stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"backend did not start: {line!r}")

    def reset(self):
        for port in (self.stable, self.canary):
            http_get(port, "/__reset")

    def counts(self):
        out = []
        for port in (self.stable, self.canary):
            status, body = http_get(port, "/__count")
            out.append(int(body) if status == 200 else 0)
        return out


# ------------------------------------------------------------------ proxies


def weights_for(proxy, split):
    if proxy == "haproxy":
        # HAProxy weights stop at 256: 995/5 is 199/1, 90/10 is 9/1.
        g = gcd(*split)
        return split[0] // g, split[1] // g
    return split


def gcd(a, b):
    while b:
        a, b = b, a % b
    return a


class Proxy:
    """One proxy under test, configured for one weighted split.

    `mode` is how clients speak to it: `http` (HTTP/1.1), `https`
    (HTTP/1.1 over TLS, certificate from `tls_files()`), or `h2c` (HTTP/2
    with prior knowledge). `extra_routes` adds that many generated routes
    on other hostnames (sluice only: the table size for the flip row);
    `held` raises connection limits for that many held client connections.
    """

    def __init__(self, kind, exes, backends, split, mode="http", extra_routes=0, held=0):
        self.kind = kind
        self.exes = exes
        self.backends = backends
        self.mode = mode
        self.held = held
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix=f"sluice-bench-{kind}-")
        self.proc = None
        # A command the proxy runs under (valgrind, for bench/profile.py).
        self.wrapper = []
        if extra_routes and kind == "sluice":
            self.replace("routes-extra.yaml", generated_routes(extra_routes))
        self.write_config(split)

    # -- configuration

    def write_config(self, split):
        stable, canary = weights_for(self.kind, split)
        b = self.backends
        if self.kind == "sluice":
            gateway = f"""apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: sluice}}
spec: {{controllerName: sluice.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: bench, namespace: default}}
spec:
  gatewayClassName: sluice
  addresses: [{{type: IPAddress, value: "127.0.0.1"}}]
  listeners:
"""
            if self.mode == "https":
                cert, key = tls_files()
                gateway += f"""  - name: https
    protocol: HTTPS
    port: {self.port}
    tls: {{certificateRefs: [{{name: bench-cert}}]}}
---
apiVersion: v1
kind: Secret
metadata: {{name: bench-cert, namespace: default}}
type: kubernetes.io/tls
data:
  tls.crt: {b64file(cert)}
  tls.key: {b64file(key)}
"""
            else:
                gateway += f"  - {{name: http, protocol: HTTP, port: {self.port}}}\n"
            for name, port in (("stable", b.stable), ("canary", b.canary)):
                gateway += f"""---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  ports: [{{name: http, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: default
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: http, port: {port}, protocol: TCP}}]
endpoints:
- addresses: ["127.0.0.1"]
"""
            route = f"""apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: bench, namespace: default}}
spec:
  parentRefs: [{{name: bench}}]
  rules:
  - backendRefs:
    - {{name: stable, port: 80, weight: {stable}}}
    - {{name: canary, port: 80, weight: {canary}}}
"""
            self.replace("gateway.yaml", gateway)
            self.replace("route.yaml", route)
        elif self.kind == "nginx":
            os.makedirs(f"{self.dir}/tmp", exist_ok=True)
            nginx_listen, nginx_tls = "", ""
            nginx_servers = "".join(
                f"    server 127.0.0.1:{port} weight={w};\n"
                for port, w in ((b.stable, stable), (b.canary, canary)) if w)
            if self.mode == "https":
                cert, key = tls_files()
                nginx_listen = " ssl"
                # nginx before 1.23.4 offers no TLS 1.3 unless told: its
                # resumed TLS 1.2 handshakes skip the key exchange that a
                # TLS 1.3 resumption (sluice's, HAProxy's) still does.
                nginx_tls = (f"ssl_certificate {cert}; ssl_certificate_key {key}; "
                             "ssl_protocols TLSv1.2 TLSv1.3;")
            elif self.mode == "h2c":
                nginx_listen = " http2"
            self.replace("nginx.conf", f"""user root;
worker_processes {PROXY_WORKERS};
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
worker_rlimit_nofile {max(8192, 2 * self.held + 1024)};
events {{ worker_connections {max(4096, self.held + 1024)}; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 60s;
  client_body_temp_path {self.dir}/tmp;
  proxy_temp_path {self.dir}/tmp;
  upstream backends {{
{nginx_servers}
    keepalive 64;
    keepalive_requests 1000000;
  }}
  server {{
    listen 127.0.0.1:{self.port}{nginx_listen};
    {nginx_tls}
    location / {{
      proxy_pass http://backends;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
    }}
  }}
}}
""")
        elif self.kind == "haproxy":
            haproxy_bind = ""
            haproxy_servers = "".join(
                f"  server {name} 127.0.0.1:{port} weight {w}\n"
                for name, port, w in (("stable", b.stable, stable), ("canary", b.canary, canary))
                if w)
            if self.mode == "https":
                cert, key = tls_files()
                pem = f"{self.dir}/combined.pem"
                with open(pem, "w") as f:
                    f.write(open(cert).read() + open(key).read())
                haproxy_bind = f" ssl crt {pem} alpn http/1.1"
            elif self.mode == "h2c":
                haproxy_bind = " proto h2"
            self.replace("haproxy.cfg", f"""global
  nbthread {PROXY_WORKERS}
  maxconn {max(4096, self.held + 1024)}
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 60s
  option http-keep-alive
  option forwardfor
  http-reuse always
frontend fe
  maxconn {max(4096, self.held + 1024)}
  bind 127.0.0.1:{self.port}{haproxy_bind}
  http-request set-header X-Forwarded-Proto {"https" if self.mode == "https" else "http"}
  default_backend be
backend be
  balance roundrobin
{haproxy_servers}""")

    def replace(self, name, text):
        """Write a file whole and atomically (a watcher never sees half)."""
        tmp = f"{self.dir}/.{name}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, f"{self.dir}/{name}")

    # -- life cycle

    def start(self):
        if self.kind == "sluice":
            self.admin = free_port()
            cmd = [self.exes["sluice"], "serve", "-f", self.dir,
                   "--admin", f"127.0.0.1:{self.admin}"]
            if self.held:
                cmd += ["--max-connections", str(self.held + 1024),
                        "--max-connections-per-listener", str(self.held + 1024)]
            env = dict(os.environ, RUST_LOG="warn")
        elif self.kind == "nginx":
            cmd = ["nginx", "-p", self.dir, "-c", f"{self.dir}/nginx.conf",
                   "-g", "daemon off;"]
            env = None
        else:
            cmd = ["haproxy", "-W", "-f", f"{self.dir}/haproxy.cfg"]
            env = None
        self.proc = subprocess.Popen(["taskset", "-c", PROXY_CPU] + self.wrapper + cmd, env=env,
                                     stdout=subprocess.DEVNULL,
                                     stderr=open(f"{self.dir}/stderr.log", "w"))
        wait_until(self.answers, f"{self.kind} to answer",
                   deadline_s=120.0 if self.wrapper else 20.0)

    def answers(self):
        if self.mode == "https":
            return http_get(self.port, tls=True)[0] == 200
        if self.mode == "h2c":
            return subprocess.run(["h2load", "-n1", "-c1", f"http://127.0.0.1:{self.port}/"],
                                  capture_output=True, text=True).stdout.count("1 succeeded") == 1
        return http_get(self.port)[0] == 200

    def url(self):
        scheme = "https" if self.mode == "https" else "http"
        return f"{scheme}://127.0.0.1:{self.port}/"

    def reload(self):
        if self.kind == "sluice":
            pass  # the file written by write_config is watched
        elif self.kind == "nginx":
            subprocess.run(["nginx", "-p", self.dir, "-c", f"{self.dir}/nginx.conf",
                            "-s", "reload"], check=True, capture_output=True)
        else:
            self.proc.send_signal(signal.SIGUSR2)

    def reloads_seen(self):
        if self.kind != "sluice":
            return None
        status, body = http_get(self.admin, "/metrics")
        m = re.search(r"^sluice_config_reloads_total (\d+)", body or "", re.M)
        return int(m.group(1)) if status == 200 and m else None

    def pids(self):
        # taskset execs the command, so the Popen pid is the proxy's.
        return tree(self.proc.pid)

    def stop(self):
        if self.proc:
            stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class Direct:
    """The backend alone: the limit no proxy can beat."""

    kind = "direct"

    def __init__(self, backends):
        self.backends = backends
        self.port = backends.stable

    def start(self):
        pass

    def pids(self):
        return [self.backends.proc.pid]

    def stop(self):
        pass


# -------------------------------------------------------------------- load


def wrk(port, seconds, url=None, headers=()):
    cmd = ["taskset", "-c", LOAD_CPU, "wrk", f"-t{WRK_THREADS}", "-c50", f"-d{seconds}s", "--latency"]
    for h in headers:
        cmd += ["-H", h]
    out = subprocess.run(cmd + [url or f"http://127.0.0.1:{port}/"],
                         check=True, capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))
    errors = 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errors += sum(int(x) for x in m.groups())
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errors += int(m.group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    return {"rps": rps, "p50_us": to_us(lat.get("50")), "p99_us": to_us(lat.get("99")),
            "errors": errors, "requests": requests}


def to_us(text):
    if not text:
        return None
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    value, unit = float(m.group(1)), m.group(2)
    return value * {"us": 1, "ms": 1e3, "s": 1e6}[unit]


def loadgen(exe, port, rate, seconds, connections=50):
    out = subprocess.run(
        ["taskset", "-c", LOAD_CPU, exe, "run", "--url", f"http://127.0.0.1:{port}/",
         "--rate", str(rate), "--duration", str(seconds), "--connections", str(connections)],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measured(target, run):
    """Run `run()` and add the proxy's CPU per request and the backends' split."""
    pids = target.pids()
    target.backends.reset()
    before = cpu_split(pids)
    result = run()
    after = cpu_split(pids)
    stable, canary = target.backends.counts()
    served = stable + canary
    per_req = lambda ticks: ticks * 1e6 / CLK_TCK / served if served else None
    result["cpu_us_per_req"] = per_req(sum(after) - sum(before))
    # User and kernel time apart (what the kernel spends on the sockets'
    # system calls is the second).
    result["user_us_per_req"] = per_req(after[0] - before[0])
    result["sys_us_per_req"] = per_req(after[1] - before[1])
    result["stable"], result["canary"] = stable, canary
    result["peak_rss_kib"] = status_kib(target.pids(), "VmHWM")
    return result


def median_of(runs):
    out = {}
    for key in runs[0]:
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
        out[key] = statistics.median(values) if values else None
    return out


# ------------------------------------------------------------------- suites


def closed_loop(args, exes, backends):
    rows = []
    seconds = 1 if args.quick else 10
    runs = 1 if args.quick else 3
    plan = [("direct", None)] + [(k, s) for s in ((995, 5), (90, 10))
                                 for k in ("sluice", "nginx", "haproxy")]
    for kind, split in plan:
        target = Direct(backends) if kind == "direct" else Proxy(kind, exes, backends, split)
        try:
            target.start()
            time.sleep(0.3)
            idle = status_kib(target.pids(), "VmRSS")
            if not args.quick:
                wrk(target.port, 1)  # warm-up: pools filled, caches hot
            results = [measured(target, lambda: wrk(target.port, seconds)) for _ in range(runs)]
            row = median_of(results)
            row.update(name=kind if split is None else f"{kind} {split[0]}/{split[1]}",
                       idle_rss_kib=idle)
            rows.append(row)
            log(f"closed loop {row['name']}: {row['rps']:.0f} req/s, "
                f"{fmt(row['cpu_us_per_req'], 1)} us CPU/req")
        finally:
            target.stop()
    return rows


def fixed_rate(args, exes, backends):
    rows = []
    seconds = 1.5 if args.quick else 10
    for kind in ("direct", "sluice", "nginx", "haproxy"):
        target = Direct(backends) if kind == "direct" else Proxy(kind, exes, backends, (995, 5))
        try:
            target.start()
            loadgen(exes["loadgen"], target.port, args.rate, 0.5)  # warm-up
            row = measured(target, lambda: loadgen(exes["loadgen"], target.port, args.rate, seconds))
            row["name"] = kind
            rows.append(row)
            log(f"fixed rate {kind}: p99 {row['p99_us']} us, failed {row['failed']}")
        finally:
            target.stop()
    return rows


def reloads(args, exes, backends):
    rows = []
    flips = 10
    gap = 0.3 if args.quick else 1.0
    seconds = flips * gap + 2
    for kind in ("sluice", "nginx", "haproxy"):
        target = Proxy(kind, exes, backends, (995, 5))
        try:
            target.start()
            loadgen(exes["loadgen"], target.port, args.reload_rate, 0.5)  # warm-up
            before = target.reloads_seen() if kind == "sluice" else None
            load = subprocess.Popen(
                ["taskset", "-c", LOAD_CPU, exes["loadgen"], "run", "--url",
                 f"http://127.0.0.1:{target.port}/", "--rate", str(args.reload_rate),
                 "--duration", str(seconds), "--connections", "50"],
                stdout=subprocess.PIPE, text=True)
            time.sleep(0.5)
            for i in range(flips):
                target.write_config((90, 10) if i % 2 == 0 else (995, 5))
                target.reload()
                time.sleep(gap)
            out, _ = load.communicate(timeout=seconds + 30)
            row = json.loads(out.strip().splitlines()[-1])
            row["name"] = kind
            row["flips"] = flips
            if kind == "sluice":
                after = target.reloads_seen()
                row["reloads_applied"] = (after - before) if None not in (before, after) else None
            rows.append(row)
            log(f"reload {kind}: {row['failed']} failed of {row['scheduled']}")
        finally:
            target.stop()
    return rows


def h2load(url, seconds):
    out = subprocess.run(
        ["taskset", "-c", LOAD_CPU, "h2load", "-c50", "-m10", "-D", str(seconds), url],
        check=True, capture_output=True, text=True).stdout
    m = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                     r"(\d+) errored", out)
    return {"rps": float(m.group(1)) if m else None,
            "requests": int(done.group(1)) if done else None,
            "errors": int(done.group(3)) + int(done.group(4)) if done else None}


PROTOCOL_ROWS = (
    ("https", "HTTPS keep-alive", ()),
    ("https", "HTTPS, a TLS handshake per request", ("Connection: close",)),
    ("h2c", "h2c, 50 connections x 10 streams", ()),
)


def protocols(args, exes, backends):
    """CPU per request over TLS (keep-alive, and a handshake per request)
    and over HTTP/2 with prior knowledge (h2load -c50 -m10), 995/5."""
    rows = []
    seconds = 1 if args.quick else 10
    runs = 1 if args.quick else 3
    for mode, label, headers in PROTOCOL_ROWS:
        for kind in ("sluice", "nginx", "haproxy"):
            target = Proxy(kind, exes, backends, (995, 5), mode=mode)
            try:
                target.start()
                if mode == "h2c":
                    run = lambda: h2load(target.url(), seconds)  # noqa: E731
                else:
                    run = lambda: wrk(target.port, seconds, target.url(), headers)  # noqa: E731
                if not args.quick:
                    run()  # warm-up
                row = median_of([measured(target, run) for _ in range(runs)])
                row.update(name=f"{kind}: {label}", proxy=kind, mode=label)
                rows.append(row)
                log(f"{label} {kind}: {fmt(row['rps'])} req/s, "
                    f"{fmt(row['cpu_us_per_req'], 1)} us CPU/req")
            finally:
                target.stop()
    return rows


def raise_fd_limit(n):
    import resource
    want = n + 4096
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        # Root may raise the hard limit too (with CAP_SYS_RESOURCE); the
        # proxies inherit both.
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
        except (ValueError, OSError) as e:
            raise SystemExit(f"bench: {n} held connections need {want} file descriptors; "
                             f"the hard limit is {hard} and cannot be raised here ({e}): "
                             "run as root with CAP_SYS_RESOURCE, or raise `ulimit -Hn` first")


H2C_GET = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
           # HEADERS, END_STREAM | END_HEADERS, stream 1: GET, http, /, :authority h
           + b"\x00\x00\x06\x01\x05\x00\x00\x00\x01" + b"\x82\x86\x84\x41\x01h")


def hold_connections(target, n):
    """Open `n` client connections, one request answered on each, and keep
    them open. Returns the sockets."""
    ctx = insecure_tls() if target.mode == "https" else None
    socks = []
    for i in range(n):
        raw = socket.socket()
        # Past ~28,000 connections one source address runs out of ports.
        raw.bind((f"127.0.0.{2 + i // 20000}", 0))
        raw.settimeout(10)
        raw.connect(("127.0.0.1", target.port))
        s = ctx.wrap_socket(raw) if ctx else raw
        s.sendall(H2C_GET if target.mode == "h2c" else b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
        got = b""
        while b"ok\n" not in got:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError(f"connection {i} closed before its answer")
            got += chunk
        socks.append(s)
    return socks


def answer_again(socks, mode):
    """One more request on every held connection; returns the failures."""
    failed = 0
    for s in socks:
        try:
            if mode == "h2c":
                # Stream 3, same header block.
                s.sendall(b"\x00\x00\x06\x01\x05\x00\x00\x00\x03\x82\x86\x84\x41\x01h")
            else:
                s.sendall(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
            got = b""
            while b"ok\n" not in got:
                chunk = s.recv(65536)
                if not chunk:
                    raise OSError("closed")
                got += chunk
        except OSError:
            failed += 1
    return failed


def held(args, exes, backends):
    """Resident memory with no client connection and with N idle
    keep-alive connections (one request answered on each), per proxy."""
    n = args.held or (300 if args.quick else 5000)
    raise_fd_limit(n)
    modes = ("http",) if args.quick else ("http", "https", "h2c")
    rows = []
    for mode in modes:
        for kind in ("sluice", "nginx", "haproxy"):
            target = Proxy(kind, exes, backends, (995, 5), mode=mode, held=n)
            socks = []
            try:
                try:
                    target.start()
                except RuntimeError as e:
                    if kind == "sluice":
                        raise
                    # A peer that cannot hold N under this fd limit (HAProxy
                    # wants two per connection): its row says so.
                    log(f"held {kind} {mode}: did not start for {n} connections: {e}")
                    rows.append({"name": f"{kind} {mode}", "proxy": kind, "mode": mode,
                                 "connections": n, "rss_idle_kib": None, "rss_held_kib": None,
                                 "kib_per_connection": None, "failed": None})
                    continue
                time.sleep(0.5)
                before = status_kib(target.pids(), "VmRSS")
                socks = hold_connections(target, n)
                # Longer than sluice's 1 s before an idle connection is
                # parked off its task (nginx holds it as a plain structure
                # at once).
                time.sleep(2.5)
                after = status_kib(target.pids(), "VmRSS")
                failed = answer_again(socks, mode)
                row = {"name": f"{kind} {mode}", "proxy": kind, "mode": mode, "connections": n,
                       "rss_idle_kib": before, "rss_held_kib": after,
                       "kib_per_connection": (after - before) / n, "failed": failed}
                rows.append(row)
                log(f"held {kind} {mode}: {n} connections, {row['kib_per_connection']:.2f} KiB each, "
                    f"{failed} failed")
            finally:
                for s in socks:
                    s.close()
                target.stop()
    return rows


def flip_times(kind, exes, backends, extra, count):
    """`count` flips of one proxy (`extra` more routes for sluice): the
    times (ms) from each write to the first request served by it, sorted,
    and how many were not served within 30 s."""
    target = Proxy(kind, exes, backends, (1, 0), extra_routes=extra)
    b = backends
    try:
        target.start()
        times, missed = [], 0
        for i in range(count):
            split, port = ((0, 1), b.canary) if i % 2 == 0 else ((1, 0), b.stable)
            started = time.perf_counter()
            target.write_config(split)
            target.reload()
            deadline, again = started + 30, started + 5
            while time.perf_counter() < deadline:
                status, body = http_get(target.port, "/__port")
                if status == 200 and body.strip() == str(port):
                    times.append((time.perf_counter() - started) * 1e3)
                    break
                if time.perf_counter() > again:
                    # A peer may drop a reload signal that arrives
                    # while it is still busy with the previous one.
                    target.reload()
                    again += 5
            else:
                missed += 1
                log(f"{kind}: flip {i} not served within 30 s")
            time.sleep(0.3)
    finally:
        target.stop()
    return sorted(times), missed


def k8s_flip_row(exes, extra, count):
    """Kubernetes mode: from the watch event to the first request served
    (`benches/k8s_flip.rs`), as its JSON row."""
    out = subprocess.run(
        [exes["k8s_flip"], "run", "--sluice", exes["sluice"],
         "--routes", str(extra), "--flips", str(count)],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def flips(args, exes, backends):
    """Weight flip visible after: from the configuration write (and the
    peer's reload command) to the first request the new configuration
    serves, measured with a new connection per probe. The route sends
    everything to one backend and the flip to the other, so each probe's
    answer (`GET /__port`) says which configuration served it."""
    count = 5 if args.quick else 20
    plan = [("sluice", 0), ("nginx", 0), ("haproxy", 0), ("sluice", 100)]
    if not args.quick:
        plan.append(("sluice", 10000))
    rows = []
    for kind, extra in plan:
        times, missed = flip_times(kind, exes, backends, extra, count)
        row = {"name": f"{kind}" + (f", {extra:,} more routes" if extra else ""),
               "proxy": kind, "routes": extra + 1, "flips": count, "missed": missed,
               "median_ms": statistics.median(times) if times else None,
               "max_ms": times[-1] if times else None}
        rows.append(row)
        log(f"flip {row['name']}: median {fmt(row['median_ms'], 1)} ms, "
            f"max {fmt(row['max_ms'], 1)} ms, {missed} missed")
    # Kubernetes mode: from the watch event to the first request served.
    for extra in (100,) if args.quick else (0, 100, 10000):
        row = k8s_flip_row(exes, extra, count)
        row.update(name="sluice --kubernetes" + (f", {extra:,} more routes" if extra else ""),
                   proxy="sluice")
        rows.append(row)
        log(f"flip {row['name']}: median {row['median_ms']:.1f} ms, max {row['max_ms']:.1f} ms")
    return rows


def scale(args, exes):
    rows = []
    sizes = [(1000, False)] if args.quick else [(1000, False), (10000, False), (50000, False),
                                                (1000, True), (10000, True)]
    for n, one_host in sizes:
        cmd = ["taskset", "-c", PROXY_CPU, exes["scale"], "scale", str(n)]
        if one_host:
            cmd.append("--one-host")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        rows.append(row)
        log(f"scale {n}{' one host' if one_host else ''}: translate {row['translate_ms']} ms, "
            f"lookup {row['lookup_ns']} ns")
    return rows


def rebuild(args, exes, backends):
    n = 1000 if args.quick else 10000
    count = 20 if args.quick else 1000
    seconds = 1.5 if args.quick else 10
    port = free_port()
    tool = subprocess.Popen(
        ["taskset", "-c", PROXY_CPU, exes["scale"], "reload", str(n),
         "--listen", f"127.0.0.1:{port}", "--stable", f"127.0.0.1:{backends.stable}",
         "--canary", f"127.0.0.1:{backends.canary}", "--interval-ms", "100",
         "--reloads", str(count)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready = tool.stdout.readline()
        if not ready.startswith("ready"):
            raise RuntimeError(f"reload tool did not start: {ready!r}")
        loadgen(exes["loadgen"], port, args.rate, 0.5)  # warm-up
        steady = loadgen(exes["loadgen"], port, args.rate, seconds)
        tool.stdin.write("go\n")
        tool.stdin.flush()
        during = loadgen(exes["loadgen"], port, args.rate, seconds)
        out = tool.stdout.readline()
        tool.wait(timeout=30)
        summary = json.loads(out)
    finally:
        stop(tool)
    log(f"rebuild: steady p99 {steady['p99_us']} us, reloading p99 {during['p99_us']} us")
    return {"steady": steady, "reloading": during, "summary": summary}


# ------------------------------------------------------------------- output


def fmt(v, digits=0):
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def mib(kib):
    return "-" if kib is None else f"{kib / 1024:.1f}"


def print_tables(results):
    print("\n### Closed loop: wrk -t1 -c50, HTTP/1.1 keep-alive"
          f" ({results['meta']['closed_runs']} run(s) of {results['meta']['closed_seconds']} s, median)\n")
    print("| row | req/s | p50 µs | p99 µs | proxy CPU µs/req | peak RSS MiB | idle RSS MiB "
          "| stable / canary received | canary % | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results["closed_loop"]:
        total = (r["stable"] or 0) + (r["canary"] or 0)
        pct = 100.0 * r["canary"] / total if total else None
        print(f"| {r['name']} | {fmt(r['rps'])} | {fmt(r['p50_us'])} | {fmt(r['p99_us'])} "
              f"| {fmt(r['cpu_us_per_req'], 1)} | {mib(r['peak_rss_kib'])} | {mib(r['idle_rss_kib'])} "
              f"| {fmt(r['stable'])} / {fmt(r['canary'])} | {fmt(pct, 2)} | {fmt(r['errors'])} |")
    print(f"\n### Fixed rate: {results['meta']['rate']} req/s open loop, 50 connections,"
          " latency from the scheduled send time\n")
    print("| row | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | proxy CPU µs/req "
          "| generator lag p99 µs | failed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results["fixed_rate"]:
        print(f"| {r['name']} | {fmt(r['p50_us'])} | {fmt(r['p90_us'])} | {fmt(r['p99_us'])} "
              f"| {fmt(r['p999_us'])} | {fmt(r['max_us'])} | {fmt(r['cpu_us_per_req'], 1)} "
              f"| {fmt(r['lag_p99_us'])} | {fmt(r['failed'])} |")
    print(f"\n### Reload: weights flipped 10 times under {results['meta']['reload_rate']} req/s"
          " (open loop, 50 keep-alive connections, no retries)\n")
    print("| proxy | requests | failed | closed before response | connect failed "
          "| non-2xx | timed out | p99 µs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results["reload"]:
        print(f"| {r['name']} | {fmt(r['scheduled'])} | {fmt(r['failed'])} | {fmt(r['closed'])} "
              f"| {fmt(r['connect_failed'])} | {fmt(r['non_2xx'])} | {fmt(r['timed_out'])} "
              f"| {fmt(r['p99_us'])} |")
    print("\n### Other protocols: CPU per request, 995/5"
          f" ({results['meta']['closed_runs']} run(s) of {results['meta']['closed_seconds']} s, median)\n")
    print("| row | req/s | proxy CPU µs/req | peak RSS MiB | errors |")
    print("|---|---:|---:|---:|---:|")
    for r in results["protocols"]:
        print(f"| {r['name']} | {fmt(r['rps'])} | {fmt(r['cpu_us_per_req'], 1)} "
              f"| {mib(r['peak_rss_kib'])} | {fmt(r['errors'])} |")
    print("\n### Memory per idle keep-alive client connection (one request answered on each)\n")
    print("| proxy, protocol | connections | RSS with none MiB | RSS with all held MiB "
          "| KiB per connection | failed on a second request |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results["held"]:
        print(f"| {r['name']} | {fmt(r['connections'])} | {mib(r['rss_idle_kib'])} "
              f"| {mib(r['rss_held_kib'])} | {fmt(r['kib_per_connection'], 2)} | {fmt(r['failed'])} |")
    print("\n### Weight flip visible after: configuration written to the first request served by it\n")
    print("| proxy | flips | median ms | max ms | not served within 30 s |")
    print("|---|---:|---:|---:|---:|")
    for r in results["flip"]:
        print(f"| {r['name']} | {r['flips']} | {fmt(r['median_ms'], 1)} | {fmt(r['max_ms'], 1)} "
              f"| {fmt(r.get('missed', 0))} |")
    print("\n### Scale: generated HTTPRoutes (parse and translate on one core)\n")
    print("| routes | hosts | parse ms | translate ms | match ns (median) "
          "| RSS after parse MiB | RSS with table MiB |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in results["scale"]:
        hosts = "one host" if r["one_host"] else "10 routes per host"
        print(f"| {fmt(r['routes'])} | {hosts} | {fmt(r['parse_ms'], 1)} | {fmt(r['translate_ms'], 1)} "
              f"| {fmt(r['lookup_ns'])} | {mib(r['rss_snapshot_kib'])} | {mib(r['rss_translated_kib'])} |")
    rb = results["rebuild"]
    s = rb["summary"]
    print(f"\n### Table rebuilt every 100 ms with {fmt(s['routes'])} routes loaded"
          f" ({results['meta']['rate']} req/s open loop)\n")
    print("| phase | p50 µs | p99 µs | failed |")
    print("|---|---:|---:|---:|")
    for phase in ("steady", "reloading"):
        r = rb[phase]
        print(f"| {phase} | {fmt(r['p50_us'])} | {fmt(r['p99_us'])} | {fmt(r['failed'])} |")
    print(f"\n{fmt(s['reloads'])} rebuilds in {s['elapsed_s']} s; translate p50 "
          f"{s['translate_p50_ms']} ms, max {s['translate_max_ms']} ms; RSS ready "
          f"{mib(s['rss_ready_kib'])} MiB, after the first rebuild {mib(s['rss_after_first_kib'])} MiB, "
          f"after the last {mib(s['rss_after_last_kib'])} MiB.")


def check_numbers(results):
    """Quick mode's only assertion: every row produced numbers."""
    missing = []
    for r in results["closed_loop"]:
        for key in ("rps", "p50_us", "p99_us", "cpu_us_per_req", "peak_rss_kib"):
            if not r.get(key):
                missing.append(f"closed loop {r['name']}: {key}")
        if not r.get("stable"):
            missing.append(f"closed loop {r['name']}: backend counts")
    for r in results["fixed_rate"] + results["reload"]:
        if not r.get("ok") or not r.get("p99_us"):
            missing.append(f"{r['name']}: no successful requests")
    for r in results["protocols"]:
        if not r.get("cpu_us_per_req") or not r.get("rps"):
            missing.append(f"{r['name']}: no numbers")
    for r in results["held"]:
        if r.get("kib_per_connection") is None or r.get("failed"):
            missing.append(f"held {r['name']}: no numbers or failed requests")
            # (at --quick's 300 connections every proxy must hold them all)
    for r in results["flip"]:
        # A peer's reload that never took is the peer's figure, not a
        # missing row; sluice must serve every flip.
        if not r.get("median_ms") or (r["proxy"] == "sluice" and r.get("missed")):
            missing.append(f"flip {r['name']}: no numbers")
    for r in results["scale"]:
        if not r.get("translate_ms") or not r.get("lookup_ns"):
            missing.append(f"scale {r['routes']}: no numbers")
    for phase in ("steady", "reloading"):
        if not results["rebuild"][phase].get("ok"):
            missing.append(f"rebuild {phase}: no successful requests")
    return missing


SUITES = ("closed", "fixed", "reload", "protocols", "held", "flip", "scale", "rebuild")


def cores(args, exes, backends):
    """Requests per second on one core and on two, per proxy (995/5).

    One core: the proxy alone on core 0 (one nginx worker, one HAProxy
    thread, one sluice worker), wrk on core 1. Two cores: the proxy on
    cores 0 and 1 (two workers or threads; sluice takes one per core it
    may run on) and wrk with two threads on the same two cores, so the
    load generator competes with the proxy for them. The backends stay on
    core 1 in both. Not part of the default run: `--only cores`.
    """
    global PROXY_CPU, LOAD_CPU, PROXY_WORKERS, WRK_THREADS
    rows = []
    seconds = 1 if args.quick else 10
    runs = 1 if args.quick else 3
    saved = (PROXY_CPU, LOAD_CPU, PROXY_WORKERS, WRK_THREADS)
    try:
        for layout, proxy_cpu, load_cpu, workers in (("1 core", "0", "1", 1),
                                                     ("2 cores", "0,1", "0,1", 2)):
            PROXY_CPU, LOAD_CPU, PROXY_WORKERS, WRK_THREADS = proxy_cpu, load_cpu, workers, workers
            for kind in ("sluice", "nginx", "haproxy"):
                target = Proxy(kind, exes, backends, (995, 5))
                try:
                    target.start()
                    time.sleep(0.3)
                    if not args.quick:
                        wrk(target.port, 1)
                    results = [measured(target, lambda: wrk(target.port, seconds))
                               for _ in range(runs)]
                    row = median_of(results)
                    row.update(name=kind, layout=layout)
                    rows.append(row)
                    log(f"cores {layout} {kind}: {row['rps']:.0f} req/s, "
                        f"{fmt(row['cpu_us_per_req'], 1)} us CPU/req")
                finally:
                    target.stop()
    finally:
        PROXY_CPU, LOAD_CPU, PROXY_WORKERS, WRK_THREADS = saved
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sluice", required=True, help="release sluice binary")
    p.add_argument("--tools", required=True, help="JSON {backend, loadgen, scale} executables")
    p.add_argument("--rate", type=int, default=5000)
    p.add_argument("--reload-rate", type=int, default=10000)
    p.add_argument("--out", default=os.path.join(ROOT, "target", "bench-results.json"))
    p.add_argument("--only", default=",".join(SUITES))
    p.add_argument("--held", type=int, default=0,
                   help="idle connections held for the memory row (default 5,000; --quick 300); "
                        "50,000 needs root (the fd limit is raised) and takes a few minutes")
    args = p.parse_args()
    exes = json.loads(args.tools)
    exes["sluice"] = args.sluice
    only = set(args.only.split(","))
    started = time.time()
    backends = Backends(exes["backend"])
    results = {"meta": {
        "quick": args.quick, "rate": args.rate, "reload_rate": args.reload_rate,
        "closed_runs": 1 if args.quick else 3, "closed_seconds": 1 if args.quick else 10,
    }, "closed_loop": [], "fixed_rate": [], "reload": [], "protocols": [], "held": [], "flip": [],
        "scale": [], "rebuild": {"steady": {}, "reloading": {}, "summary": {}}}
    try:
        if "closed" in only:
            results["closed_loop"] = closed_loop(args, exes, backends)
        if "fixed" in only:
            results["fixed_rate"] = fixed_rate(args, exes, backends)
        if "reload" in only:
            results["reload"] = reloads(args, exes, backends)
        if "protocols" in only:
            results["protocols"] = protocols(args, exes, backends)
        if "held" in only:
            results["held"] = held(args, exes, backends)
        if "flip" in only:
            results["flip"] = flips(args, exes, backends)
        if "scale" in only:
            results["scale"] = scale(args, exes)
        if "rebuild" in only:
            results["rebuild"] = rebuild(args, exes, backends)
        if "cores" in only:
            results["cores"] = cores(args, exes, backends)
    finally:
        stop(backends.proc)
    results["meta"]["seconds"] = round(time.time() - started, 1)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    if only == set(SUITES):
        print_tables(results)
    else:
        print(json.dumps(results, indent=1))
    log(f"done in {results['meta']['seconds']} s; raw results in {args.out}")
    if args.quick:
        missing = check_numbers(results) if only == set(SUITES) else []
        rows = (len(results["closed_loop"]) + len(results["fixed_rate"]) + len(results["reload"])
                + len(results["protocols"]) + len(results["held"]) + len(results["flip"])
                + len(results["scale"]) + 2)
        if missing:
            print("rows without numbers:\n  " + "\n  ".join(missing), file=sys.stderr)
        print(f"bench: {rows - len(missing)} passed, {len(missing)} failed")
        if missing:
            sys.exit(1)


if __name__ == "__main__":
    main()
