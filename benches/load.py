#!/usr/bin/env python3
"""The one-run load benchmark (issue 13): vigia in both stores, the peer of ../shared/bench
and two bare floors, on one private Redis, each at saturation with the same wrk load, then
the hammering workload; throughput, latency and the CPU per request of every process.

Usage: benches/load.py [-d SECONDS] [-c CONNECTIONS] [-t THREADS] [--rows ROW,...]
                       [--repeat N] [--no-build]

Rows, in this order (default: all of them):
  redis            vigia, Redis mode (release binary, config.toml, benches/rules/bench.toml)
  embedded         vigia, embedded store (a fresh data folder)
  peer             ../shared/bench/peer.sh: node + rate-limiter-flexible over the same Redis
  floor-http       examples/floor_http.rs: actix-web + serde, no store
  floor-redis      examples/floor_redis.rs: the same + one EVALSHA of the bench scene's script
  hammer-redis     the hammering workload (benches/wrk/hammer.lua: 90 % of checks from 1000
  hammer-embedded  accounts already over user_10s, 10 % fresh) on vigia Redis mode,
  hammer-peer      vigia embedded and the peer

Each row: a fresh service process, a 2 s warm-up with the row's wrk script, FLUSHALL
(hammer rows: the warm-up instead fills the hot accounts and is kept), then the measured
`wrk -tT -cC -dD --latency` run. The saturation rows use ../shared/bench/wrk-check.lua, the
peer's script. CPU per request is utime + stime from /proc/PID/stat (the service's whole
process tree, redis-server) or getrusage (wrk) over the measured run, divided by the
requests wrk completed. Bytes per allowed check (2xx): Redis `INFO memory` used_memory at
the end of the run minus after the FLUSHALL, and for the redis row `MEMORY USAGE` of every
key summed into request records and windows (issue 13: records within what the windows
hold); embedded: the service's VmRSS growth and the data folder's growth (file sizes) over
the run. Both are what is still held at the end, so
a run shorter than a window shows less than the window would hold.

wrk-check.lua seeds each wrk thread with the same os.time(), so the threads send the same
users: a user drawn twice by one thread gets four checks and its fourth is denied. The
share of (genuine, 429) denies on the saturation rows therefore grows with the rate.

Then the ratios against the peer on the same workload, and issue 13's targets met or not.

--repeat N measures every row N times, interleaved (all rows, then all rows again…), so
that a drift of the machine (the peer's own rate has moved 9k–20k/s between runs here)
reaches every row alike. The tables then show, per row, the repetition with the median
rate and the spread of rates; a ratio is taken within each repetition (a row against the
peer measured a minute from it) and the median of those ratios is reported and judged.
There is no paced mode: wrk cannot hold a rate, and wrk2 is not packaged in Debian.

Environment: SHARED (default ../shared, holding bench/peer.sh and bench/wrk-check.lua).
Needs: wrk, redis-server + redis-cli, node + npm (the peer installs its packages on first
run), cargo (builds the release binary and the floors unless --no-build).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HZ = os.sysconf("SC_CLK_TCK")
ROWS = [
    "redis",
    "embedded",
    "peer",
    "floor-http",
    "floor-redis",
    "hammer-redis",
    "hammer-embedded",
    "hammer-peer",
]
# Which peer row a row is compared with.
PEER_OF = {r: ("hammer-peer" if r.startswith("hammer-") else "peer") for r in ROWS}
# Issue 13's "done when": (row, throughput ratio at least, p99 ratio at most or None).
TARGETS = [
    ("redis", 2.0, 0.6),
    ("embedded", 4.0, None),
    ("hammer-redis", 4.0, None),
]
TOOLS = {  # tool -> Debian package
    "wrk": "wrk",
    "redis-server": "redis-server",
    "redis-cli": "redis-tools",
    "node": "nodejs",
    "npm": "npm",
}


class BenchError(Exception):
    """A setup step failed; the message says which and why."""


@dataclass
class Row:
    name: str
    rps: float = 0.0
    requests: int = 0
    non2xx: int = 0
    socket_errors: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    svc_us: float | None = None
    redis_us: float | None = None
    wrk_us: float = 0.0
    memory: dict[str, float] = field(default_factory=dict)

    @property
    def allowed(self) -> int:
        return self.requests - self.non2xx


# ---------------------------------------------------------------- processes and /proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{what} exited ({proc.returncode}) before listening; {tail(log)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise BenchError(f"{what} never opened port {port} within {timeout_s:.0f} s; {tail(log)}")


def tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()[-8:]
    except OSError:
        return "no log"
    return f"last lines of {log}:\n  " + "\n  ".join(lines)


def cpu_ticks(pid: int) -> int:
    # Fields after the command name (which may hold spaces): utime is the 14th field.
    stat = Path(f"/proc/{pid}/stat").read_text()
    rest = stat[stat.rindex(")") + 2 :].split()
    return int(rest[11]) + int(rest[12])


def tree(pid: int) -> list[int]:
    """pid and all its descendants (node may fork; peer.sh execs node)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_ticks(pid: int) -> dict[int, int]:
    ticks = {}
    for p in tree(pid):
        try:
            ticks[p] = cpu_ticks(p)
        except OSError:
            pass  # exited between the listing and the read
    return ticks


def rss_bytes(pid: int) -> int:
    total = 0
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


class Service:
    """A process started in its own session, so its whole group is stopped with it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int, log: Path,
                 timeout_s: float = 30.0, data_dir: Path | None = None):
        self.name, self.port, self.log, self.data_dir = name, port, log, data_dir
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=REPO,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            wait_port(port, self.proc, name, log, timeout_s)
        except BenchError:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# ---------------------------------------------------------------- redis and wrk


class Redis:
    def __init__(self, tmp: Path):
        self.port = free_port()
        self.service = Service(
            "redis-server",
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(tmp)],
            {}, self.port, tmp / "redis.log")
        self.url = f"redis://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], check=True,
                              capture_output=True, text=True).stdout

    def flushall(self) -> None:
        self.cli("FLUSHALL", "SYNC")

    def memory_by_kind(self) -> dict[str, int]:
        """MEMORY USAGE of every key, summed by kind: request records (`:rq:` hashes, `:req:`
        keys before 2026-12) and the windows (everything else the bench scene writes)."""
        keys = subprocess.run(["redis-cli", "-p", str(self.port), "--scan"], check=True,
                              capture_output=True, text=True).stdout.split()
        usage = subprocess.run(["redis-cli", "-p", str(self.port)], check=True,
                               input="".join(f"MEMORY USAGE {k}\n" for k in keys),
                               capture_output=True, text=True).stdout.splitlines()
        # A key that expired since the scan answers nil, an empty line.
        if len(usage) != len(keys):
            raise BenchError(f"MEMORY USAGE answered {len(usage)} times for {len(keys)} keys")
        kinds: dict[str, int] = {"records": 0, "windows": 0}
        for key, used in zip(keys, usage):
            kind = "records" if (":rq:" in key or ":req:" in key) else "windows"
            kinds[kind] += int(used) if used.isdigit() else 0
        return kinds

    def used_memory(self) -> int:
        m = re.search(r"^used_memory:(\d+)", self.cli("INFO", "memory"), re.M)
        if not m:
            raise BenchError("redis INFO memory has no used_memory")
        return int(m.group(1))


def allows_one(name: str, port: int, within_s: float = 10.0) -> None:
    """A row must allow a first check before it is measured: a service that answers every
    check with an error is fast, and wrk counts errors as non-2xx like denies. A 5xx is
    asked again for up to `within_s`: a service may listen before its store connection is
    ready (the peer does: ioredis without an offline queue fails a command sent while it
    connects, and a FLUSHALL just before can hold Redis that long)."""
    body = (b'{"scene":"bench","user_id":"load-probe","device_id":"dev-load-probe",'
            b'"ip":"192.0.2.1","activity_id":"a1"}')
    deadline = time.monotonic() + within_s
    while True:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/check", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                status = resp.status
        except urllib.error.HTTPError as e:
            if e.code >= 500 and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise BenchError(f"{name}: a first check answered {e.code}: {e.read()[:300]!r}") from e
        except OSError as e:
            raise BenchError(f"{name}: a first check failed: {e}") from e
        if status != 200:
            raise BenchError(f"{name}: a first check answered {status}")
        return


def to_ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise BenchError(f"unreadable wrk latency {text!r}")
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[m.group(2)]


def wrk(script: Path, port: int, threads: int, conns: int, dur: float, log: Path) -> tuple[str, float]:
    """Runs wrk; returns its output and the CPU seconds it used (getrusage of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{conns}", f"-d{dur}s", "--latency", "-s", str(script),
         f"http://127.0.0.1:{port}"], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "a") as f:
        f.write(out.stdout + out.stderr)
    if out.returncode != 0:
        raise BenchError(f"wrk failed ({out.returncode}): {out.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out.stdout, cpu


def parse_wrk(name: str, text: str) -> Row:
    def grab(pattern: str, default: str | None = None) -> str:
        m = re.search(pattern, text, re.M)
        if m:
            return m.group(1)
        if default is None:
            raise BenchError(f"{name}: wrk output lacks {pattern!r}:\n{text}")
        return default

    row = Row(name)
    row.requests = int(grab(r"^\s*(\d+) requests in"))
    row.rps = float(grab(r"^Requests/sec:\s*([\d.]+)"))
    row.non2xx = int(grab(r"Non-2xx or 3xx responses:\s*(\d+)", "0"))
    errors = grab(r"Socket errors: (.*)$", "")
    row.socket_errors = sum(int(n) for n in re.findall(r"\d+", errors))
    row.p50_ms = to_ms(grab(r"^\s*50%\s+(\S+)"))
    row.p99_ms = to_ms(grab(r"^\s*99%\s+(\S+)"))
    return row


# ---------------------------------------------------------------- the rows


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path):
        self.args, self.tmp = args, tmp
        self.shared = Path(os.environ.get("SHARED", "../shared"))
        if not self.shared.is_absolute():
            self.shared = (REPO / self.shared).resolve()
        self.check_lua = self.shared / "bench" / "wrk-check.lua"
        peer = self.shared / "bench" / "peer.sh"
        for path, needed in ((self.check_lua, True), (peer, any(r.endswith("peer") for r in args.rows))):
            if needed and not path.is_file():
                raise BenchError(f"{path} is missing: set SHARED to the folder holding bench/")
        self.hammer_lua = REPO / "benches" / "wrk" / "hammer.lua"
        self.rules = tmp / "rules"
        self.rules.mkdir()
        shutil.copy(REPO / "benches" / "rules" / "bench.toml", self.rules)
        self.redis = Redis(tmp)
        self.runs = 0

    def start(self, row: str) -> Service:
        port = free_port()
        self.runs += 1
        log = self.tmp / f"{row}.log"
        release = REPO / "target" / "release"
        if row in ("redis", "embedded", "hammer-redis", "hammer-embedded"):
            store = "embedded" if row.endswith("embedded") else "redis"
            data = self.tmp / f"data-{self.runs}"
            env = {"VIGIA_LISTEN": f"127.0.0.1:{port}", "VIGIA_RULES_DIR": str(self.rules),
                   "VIGIA_STORE": store, "VIGIA_DATA_DIR": str(data),
                   "VIGIA_REDIS_URL": self.redis.url, "RUST_LOG": "warn"}
            return Service(f"vigia ({store})", [str(release / "vigia"), "--config", "config.toml"],
                           env, port, log, data_dir=data)
        if row in ("peer", "hammer-peer"):
            # The first run installs the peer's npm packages before it listens.
            return Service("the peer", [str(self.shared / "bench" / "peer.sh"), str(port),
                                        str(self.redis.port)], {}, port, log, timeout_s=300)
        if row == "floor-http":
            return Service("floor_http", [str(release / "examples" / "floor_http"),
                                          f"127.0.0.1:{port}"], {}, port, log)
        if row == "floor-redis":
            return Service("floor_redis", [str(release / "examples" / "floor_redis"),
                                           f"127.0.0.1:{port}", self.redis.url], {}, port, log)
        raise BenchError(f"unknown row {row}")

    def measure(self, name: str) -> Row:
        a = self.args
        hammer = name.startswith("hammer-")
        script = self.hammer_lua if hammer else self.check_lua
        svc = self.start(name)
        log = self.tmp / "wrk.log"
        try:
            self.redis.flushall()
            allows_one(name, svc.port)
            wrk(script, svc.port, 1, 4, 2, log)  # warm-up (hammer: fills the hot accounts)
            if not hammer:
                self.redis.flushall()
            uses_redis = name not in ("embedded", "hammer-embedded", "floor-http")
            mem0 = self.redis.used_memory()
            rss0 = rss_bytes(svc.pid)
            data_dir = svc.data_dir
            disk0 = dir_bytes(data_dir) if data_dir else 0
            s0, r0 = tree_ticks(svc.pid), cpu_ticks(self.redis.service.pid)
            out, wrk_cpu = wrk(script, svc.port, a.threads, a.conns, a.duration, log)
            s1, r1 = tree_ticks(svc.pid), cpu_ticks(self.redis.service.pid)
            row = parse_wrk(name, out)
            if row.requests == 0:
                raise BenchError(f"{name}: wrk completed no request; {tail(svc.log)}")
            per_req = 1e6 / HZ / row.requests
            # A process of the tree that started during the run counts from zero.
            row.svc_us = sum(t - s0.get(p, 0) for p, t in s1.items()) * per_req
            row.redis_us = (r1 - r0) * per_req if uses_redis else None
            row.wrk_us = wrk_cpu * 1e6 / row.requests
            if row.allowed > 0:
                if uses_redis:
                    row.memory["redis"] = (self.redis.used_memory() - mem0) / row.allowed
                if name == "redis":
                    for kind, used in self.redis.memory_by_kind().items():
                        row.memory[kind] = used / row.allowed
                if data_dir:
                    row.memory["rss"] = (rss_bytes(svc.pid) - rss0) / row.allowed
                    row.memory["data"] = (dir_bytes(data_dir) - disk0) / row.allowed
            return row
        finally:
            svc.stop()


# ---------------------------------------------------------------- report


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "–" if v is None else format(v, spec)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def report(runs: dict[str, list[Row]], args: argparse.Namespace) -> None:
    # Per row, the repetition with the median rate (lower middle for an even count).
    rows = {n: sorted(rs, key=lambda r: r.rps)[(len(rs) - 1) // 2] for n, rs in runs.items()}
    reps = f", {args.repeat} interleaved repetitions: the median one" if args.repeat > 1 else ""
    print(f"\nwrk -t{args.threads} -c{args.conns} -d{args.duration}s, one private Redis, "
          f"{os.cpu_count()} CPUs; CPU in µs per request{reps}")
    head = f"{'row':<16} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'requests':>9} " \
           f"{'non-2xx':>8} {'sockerr':>7} {'service':>8} {'redis':>7} {'wrk':>6}"
    print(head)
    print("-" * len(head))
    for r in rows.values():
        print(f"{r.name:<16} {r.rps:>9.0f} {r.p50_ms:>7.2f} {r.p99_ms:>7.2f} {r.requests:>9} "
              f"{r.non2xx:>8} {r.socket_errors:>7} {fmt(r.svc_us):>8} {fmt(r.redis_us):>7} "
              f"{r.wrk_us:>6.1f}")

    mem = [r for r in rows.values() if r.memory]
    if mem:
        print("\nbytes per allowed check (2xx), held at the end of the run")
        print(f"{'row':<16} {'allowed':>9} {'redis B':>9} {'RSS B':>9} {'data B':>9} "
              f"{'records B':>10} {'windows B':>10}")
        for r in mem:
            print(f"{r.name:<16} {r.allowed:>9} {fmt(r.memory.get('redis'), '.0f'):>9} "
                  f"{fmt(r.memory.get('rss'), '.0f'):>9} {fmt(r.memory.get('data'), '.0f'):>9} "
                  f"{fmt(r.memory.get('records'), '.0f'):>10} "
                  f"{fmt(r.memory.get('windows'), '.0f'):>10}")

    if args.repeat > 1:
        print("\nreq/s of every repetition, in order")
        for n, rs in runs.items():
            print(f"{n:<16} " + " ".join(f"{r.rps:>7.0f}" for r in rs))

    # Within each repetition, a row against the peer measured next to it; then the median.
    ratios: dict[str, tuple[float, float, list[float]]] = {}
    for n, rs in runs.items():
        peer = PEER_OF[n]
        if peer in runs and peer != n:
            tputs = [r.rps / p.rps for r, p in zip(rs, runs[peer])]
            p99s = [r.p99_ms / p.p99_ms for r, p in zip(rs, runs[peer])]
            ratios[n] = (median(tputs), median(p99s), tputs)
    if ratios:
        print("\nagainst the peer on the same workload"
              + (" (median of the repetitions; each repetition's throughput ratio)"
                 if args.repeat > 1 else ""))
        print(f"{'row':<16} {'throughput':>10} {'p99':>6}")
        for n, (tput, p99, each) in ratios.items():
            spread = "   " + " ".join(f"{t:.2f}×" for t in each) if args.repeat > 1 else ""
            print(f"{n:<16} {tput:>9.2f}× {p99:>5.2f}×{spread}")
        print("\nissue 13 targets")
        for n, tput, p99 in TARGETS:
            if n not in ratios:
                print(f"  {n}: not measured in this run")
                continue
            t, p, _ = ratios[n]
            checks = [(f"throughput ≥ {tput}× peer", t >= tput, t)]
            if p99 is not None:
                checks.append((f"p99 ≤ {p99}× peer", p <= p99, p))
            for what, ok, v in checks:
                print(f"  {n:<14} {what:<22} {v:>5.2f}×  {'met' if ok else 'NOT met'}")


# ---------------------------------------------------------------- main


def build(rows: list[str]) -> None:
    targets = []
    if any(r in rows for r in ("redis", "embedded", "hammer-redis", "hammer-embedded")):
        targets += ["--bin", "vigia"]
    for r, ex in (("floor-http", "floor_http"), ("floor-redis", "floor_redis")):
        if r in rows:
            targets += ["--example", ex]
    if targets:
        subprocess.run(["cargo", "build", "--release", "--quiet", *targets], cwd=REPO, check=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-d", "--duration", type=int, default=10, help="seconds per measured run (10)")
    p.add_argument("-c", "--conns", type=int, default=50, help="wrk connections (50)")
    p.add_argument("-t", "--threads", type=int, default=2, help="wrk threads (2)")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of: " + ", ".join(ROWS))
    p.add_argument("--repeat", type=int, default=1,
                   help="measure every row N times, interleaved; report medians (1)")
    p.add_argument("--no-build", action="store_true", help="use the binaries in target/release as they are")
    args = p.parse_args()
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; known: {ROWS}")
    args.rows = [r for r in ROWS if r in args.rows]  # always in the documented order
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    needed = dict(TOOLS)
    if not any(r.endswith("peer") for r in args.rows):
        needed.pop("node"), needed.pop("npm")
    missing = [f"{t} (Debian package {pkg})" for t, pkg in needed.items() if not shutil.which(t)]
    if not args.no_build and not shutil.which("cargo"):
        missing.append("cargo (rustup, or Debian package cargo)")
    if missing:
        print("benches/load.py needs, not on PATH: " + ", ".join(missing), file=sys.stderr)
        return 1
    if not args.no_build:
        build(args.rows)
    release = REPO / "target" / "release"
    binaries = {"redis": "vigia", "embedded": "vigia", "hammer-redis": "vigia",
                "hammer-embedded": "vigia", "floor-http": "examples/floor_http",
                "floor-redis": "examples/floor_redis"}
    absent = sorted({binaries[r] for r in args.rows if r in binaries
                     and not (release / binaries[r]).is_file()})
    if absent:
        print("benches/load.py: not built: " + ", ".join(f"target/release/{b}" for b in absent)
              + " (run without --no-build, or `cargo build --release --examples`)", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="vigia-load-"))
    bench = None
    runs: dict[str, list[Row]] = {name: [] for name in args.rows}
    try:
        bench = Bench(args, tmp)
        for rep in range(args.repeat):
            for name in args.rows:
                of = f" ({rep + 1}/{args.repeat})" if args.repeat > 1 else ""
                print(f"measuring {name}{of} …", file=sys.stderr, flush=True)
                runs[name].append(bench.measure(name))
        report(runs, args)
        return 0
    except (BenchError, subprocess.CalledProcessError) as e:
        print(f"benches/load.py: {e}", file=sys.stderr)
        return 1
    finally:
        if bench:
            bench.redis.service.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
