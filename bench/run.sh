#!/usr/bin/env bash
# sluice next to nginx and HAProxy on this machine: one entry point.
#
#   bash bench/run.sh            # the full run (about 8 minutes), prints the tables
#   bash bench/run.sh --quick    # under a minute once built; CI's smoke test
#   bash bench/run.sh --ab before=/tmp/sluice-old after=target/dist/sluice
#                                # paired A/B of sluice binaries (bench/ab.py)
#   bash bench/run.sh --flip-ab before=/tmp/sluice-old after=target/dist/sluice
#                                # paired A/B of the flip row, file and Kubernetes mode (bench/flip_ab.py)
#   bash bench/run.sh --profile instructions before=/tmp/sluice-old after=target/dist/sluice
#                                # callgrind instructions or wake-ups per request (bench/profile.py)
#   bash bench/run.sh --stalled [--baseline /tmp/sluice-old] [--rounds 3]
#                                # p99 of one backend while another stalls, with a
#                                # healthy control (bench/stalled.py)
#   bash bench/run.sh --soak [--minutes 30]   # mixed load for a long time (bench/soak.py)
#   bash bench/run.sh --rollouts [--healthy-runs 10000] [--runs 1000] [--threads N] [--seed S]
#                                # the rollout judge's simulator (benches/rollout_sim.rs): no
#                                # proxy, no load, no timing; Markdown tables for docs/rollouts.md
#
# Installs nginx, HAProxy and wrk from Debian's packages when missing (needs
# root), builds sluice as it is shipped (`--profile dist`: fat LTO, one
# codegen unit) and the bench tools (bench profile, no LTO) in the shared
# target/, then runs bench/driver.py. Any other flag goes to the driver
# (see `python3 bench/driver.py --help`).
set -euo pipefail
cd "$(dirname "$0")/.."

# The simulator needs none of what follows (nginx, HAProxy, the dist
# build, two cores): sluice's state machine on simulated traffic, in
# simulated time. Tables on stdout, progress on stderr.
if [[ "${1:-}" == --rollouts ]]; then
    shift
    exec cargo bench --quiet --bench rollout_sim -- "$@"
fi

if (($(nproc) < 2)); then
    echo "bench: needs 2 cores (proxy on core 0, load and backends on core 1)" >&2
    exit 1
fi

missing=()
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx-light)
command -v haproxy >/dev/null || [[ -x /usr/sbin/haproxy ]] || missing+=(haproxy)
command -v wrk >/dev/null || missing+=(wrk)
command -v taskset >/dev/null || missing+=(util-linux)
command -v h2load >/dev/null || missing+=(nghttp2-client)
[[ -x /usr/bin/python3 ]] || command -v python3 >/dev/null || missing+=(python3)
if ((${#missing[@]})); then
    echo "== installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # The packages' own services are not wanted: the bench starts its own.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    systemctl stop nginx haproxy >/dev/null 2>&1 || true
fi
export PATH="$PATH:/usr/sbin:/sbin"

echo "== building (the dist profile: the executable as shipped)" >&2
# The bench tools (load generator, backends, scale and flip tools) keep the
# bench profile; sluice itself is measured as it is shipped,
# target/dist/sluice (Cargo.toml, [profile.dist]).
tools=$(cargo bench --no-run --quiet --message-format=json \
    --bench backend --bench loadgen --bench scale --bench k8s_flip |
    python3 -c '
import json, sys
exes = {}
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        exes[m["target"]["name"]] = m["executable"]
print(json.dumps(exes))')
cargo build --profile dist --quiet --bin sluice
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')

PYTHON=python3
[[ -x /usr/bin/python3 ]] && PYTHON=/usr/bin/python3
if [[ "${1:-}" == --ab ]]; then
    shift
    exec "$PYTHON" bench/ab.py --tools "$tools" "$@"
fi
if [[ "${1:-}" == --flip-ab ]]; then
    shift
    exec "$PYTHON" bench/flip_ab.py --tools "$tools" "$@"
fi
if [[ "${1:-}" == --profile ]]; then
    shift
    command -v valgrind >/dev/null || { apt-get install -y -qq --no-install-recommends valgrind >/dev/null; }
    command -v perf >/dev/null || { apt-get install -y -qq --no-install-recommends linux-perf >/dev/null; }
    exec "$PYTHON" bench/profile.py --tools "$tools" "$@"
fi
if [[ "${1:-}" == --soak ]]; then
    shift
    exec "$PYTHON" bench/soak.py --sluice "$target_dir/dist/sluice" --tools "$tools" "$@"
fi
if [[ "${1:-}" == --stalled ]]; then
    shift
    exec "$PYTHON" bench/stalled.py --sluice "$target_dir/dist/sluice" --tools "$tools" "$@"
fi
exec "$PYTHON" bench/driver.py --sluice "$target_dir/dist/sluice" --tools "$tools" "$@"
