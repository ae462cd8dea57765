#!/usr/bin/env python3
"""One-run benchmark: vigia on one Redis against vigia on a local 3-master Redis Cluster,
the same limits-only coupon_claim scene and the same wrk load on both; throughput, latency,
and the CPU every check costs vigia and each redis-server.

Usage: benches/cluster.py [-d SECONDS] [-c CONNECTIONS] [-t THREADS] [--rows ROW,...]
                          [--rules shipped|limits] [--masters N] [--repeat N] [--no-build]

Rows, in this order (default: both):
  redis    vigia with [store] backend = "redis" on one private redis-server
  cluster  vigia with backend = "redis_cluster" on a private cluster of N masters (--masters,
           3 by default), no replicas (redis-cli --cluster create … --cluster-replicas 0), seeded with all three

--rules shipped (the default) is the shipped rules/ folder, scene coupon_claim: its four
limits, six signals, [trust] and score. On the cluster every key is hash-tagged by its
entity, so one check touches five slot groups (the user's, the device's, the address's,
the network's and the scene's); the network's and the scene's new-account signals need the
user's age. Nine requests in ten give user_created_at: every group then runs in one round,
reckoning the age from that date; the tenth wait for the age the user's group reads, in a
second round. --rules limits is
benches/rules/cluster/coupon_claim.toml: the same four limits alone (three groups, one
round, the cheaper limits-only scripts). The load is benches/wrk/cluster.lua: users and
devices from pools of 100k, addresses from 10k.

Both Redis setups start once, before the first row (on free ports, never 6379; a cluster
port needs port + 10000 free too, its bus), in a private temporary folder, with
--save "" --appendonly no, and are stopped at the end, on an error or on Ctrl-C. Each row
measurement: a fresh vigia (target/release/vigia --config config.toml; VIGIA_STORE,
VIGIA_REDIS_URL, VIGIA_RULES_DIR, VIGIA_DATA_DIR, VIGIA_LISTEN from the environment;
workers as config.toml says), a first check that must be allowed, a 2 s warm-up
(wrk -t1 -c4), FLUSHALL on every master, then the measured `wrk -tT -cC -dD --latency`.

Measured over that run, per check (wrk's completed requests):
  CPU µs     utime + stime from /proc/PID/stat: vigia's process tree, and each
             redis-server (every master of the cluster, and their sum)
  evalsha    INFO commandstats deltas per master: EVALSHA (+ EVAL) calls, and every
             command's calls ("cmds": commandstats counts the commands scripts run too;
             the benchmark's own INFO calls are left out)
  drain s    releases are queued and run one at a time off the answer's path: after wrk
             ends, the measurement waits until vigia's release counters stop moving (at
             most 60 s), so the releases the run queued are counted; this column says how
             long they still ran
  decisions  vigia's /metrics deltas: checks answered allowed and denied, releases (on the
             cluster, a denied check gives back what its other groups reserved: one more
             script per group that had reserved), store errors
The busiest master's CPU per check bounds the cluster: one core at 100 % serves at most
1e6 / (its µs per check) checks/s ("1-core ceiling"). On this machine every process shares
the same few cores, so the absolute rates of the two rows say little about a deployment
where each master has its own core; the CPU per check per master is the point.

--repeat N measures both rows N times, interleaved (redis, cluster, redis, cluster…), so a
drift of the machine reaches both alike; every figure printed is then the median of its N
values, taken figure by figure (a sum's median need not equal the sum of the medians), and
the rates and Redis CPU of every repetition are listed.

Needs: wrk, redis-server and redis-cli (Debian packages wrk, redis-server, redis-tools),
cargo unless --no-build (then `cargo build --release --bin vigia` runs first).
"""

from __future__ import annotations

import argparse
import json
import os
import random
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

# The helpers both benchmarks share, from the one-run load benchmark beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import BenchError, cpu_ticks, free_port, median, tail, to_ms, wait_port  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HZ = os.sysconf("SC_CLK_TCK")
ROWS = ["redis", "cluster"]
RULES = {"shipped": REPO / "rules", "limits": REPO / "benches" / "rules" / "cluster"}
SCRIPT = REPO / "benches" / "wrk" / "cluster.lua"
TOOLS = {"wrk": "wrk", "redis-server": "redis-server", "redis-cli": "redis-tools"}
PROBE = (b'{"scene":"coupon_claim","user_id":"bench-probe","device_id":"dev-bench-probe",'
         b'"ip":"192.0.2.1"}')



@dataclass
class Master:
    port: int
    cpu_us: float = 0.0      # CPU µs per check
    core_share: float = 0.0  # of one core, over the measured run
    evalsha: float = 0.0     # EVALSHA + EVAL calls per check
    cmds: float = 0.0        # every command's calls per check
    keys: int = 0            # DBSIZE at the end of the run


@dataclass
class Row:
    name: str
    rps: float = 0.0
    requests: int = 0
    non2xx: int = 0
    socket_errors: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    vigia_us: float = 0.0
    wrk_us: float = 0.0
    masters: list[Master] = field(default_factory=list)
    decisions: dict[str, float] = field(default_factory=dict)  # /metrics deltas
    drain_s: float = 0.0     # after wrk, until the queued cluster releases had run

    @property
    def redis_us(self) -> float:
        return sum(m.cpu_us for m in self.masters)

    @property
    def max_master_us(self) -> float:
        return max(m.cpu_us for m in self.masters)


# ---------------------------------------------------------------- processes and /proc
# (small helpers copied from benches/load.py, so this script stands alone)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True



def free_cluster_ports(n: int) -> list[int]:
    """n ports p, each with p + 10000 (its cluster bus) free too; never 6379."""
    ports: list[int] = []
    for _ in range(1000):
        p = random.randint(20000, 29999)
        if p in ports or p + 10000 in ports or p - 10000 in ports:
            continue
        if port_free(p) and port_free(p + 10000):
            ports.append(p)
            if len(ports) == n:
                return ports
    raise BenchError(f"found no {n} free ports p with p + 10000 free in 20000-29999")



def tree(pid: int) -> list[int]:
    """pid and all its descendants."""
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


class Service:
    """A process started in its own session, so its whole group is stopped with it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int, log: Path,
                 timeout_s: float = 30.0):
        self.name, self.port, self.log = name, port, log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=REPO,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            wait_port(port, self.proc, name, log, timeout_s)
        except BaseException:
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


# ---------------------------------------------------------------- redis


class RedisServer:
    """One private redis-server on 127.0.0.1:port, its files in its own folder."""

    def __init__(self, tmp: Path, port: int, cluster: bool):
        self.port = port
        folder = tmp / f"redis-{port}"
        folder.mkdir()
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(folder)]
        if cluster:
            argv += ["--cluster-enabled", "yes", "--cluster-config-file",
                     str(folder / "nodes.conf"), "--cluster-node-timeout", "5000"]
        self.service = Service(f"redis-server :{port}", argv, {}, port, folder / "redis.log")
        self.url = f"redis://127.0.0.1:{port}"

    @property
    def pid(self) -> int:
        return self.service.pid

    def cli(self, *args: str) -> str:
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True,
                             text=True, timeout=30)
        if out.returncode != 0 or out.stdout.startswith("ERR"):
            raise BenchError(f"redis-cli -p {self.port} {' '.join(args)}: "
                             f"{(out.stdout + out.stderr).strip()}")
        return out.stdout

    def flushall(self) -> None:
        self.cli("FLUSHALL", "SYNC")

    def command_calls(self) -> dict[str, int]:
        """INFO commandstats: calls per command (lower case, as Redis names them)."""
        calls = {}
        for m in re.finditer(r"^cmdstat_([^:]+):calls=(\d+)", self.cli("INFO", "commandstats"), re.M):
            calls[m.group(1)] = int(m.group(2))
        return calls

    def dbsize(self) -> int:
        return int(self.cli("DBSIZE").strip())

    def stop(self) -> None:
        self.service.stop()


class Store:
    """The Redis one row of vigia counts in: one server, or the masters of a cluster."""

    def __init__(self, backend: str, servers: list[RedisServer]):
        self.backend, self.servers = backend, servers
        self.url = ",".join(s.url for s in servers)

    def flushall(self) -> None:
        for s in self.servers:
            s.flushall()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


def start_cluster(tmp: Path, servers: list[RedisServer]) -> None:
    """Joins `servers` into one cluster of masters and waits until every node says ok."""
    nodes = [f"127.0.0.1:{s.port}" for s in servers]
    out = subprocess.run(["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "0",
                          "--cluster-yes"], capture_output=True, text=True, timeout=60)
    (tmp / "cluster-create.log").write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        raise BenchError(f"redis-cli --cluster create failed ({out.returncode}):\n"
                         f"{(out.stdout + out.stderr)[-1500:]}")
    deadline = time.monotonic() + 30
    while True:
        infos = {s.port: s.cli("CLUSTER", "INFO") for s in servers}
        if all("cluster_state:ok" in i and f"cluster_known_nodes:{len(servers)}" in i
               and "cluster_slots_assigned:16384" in i for i in infos.values()):
            return
        if time.monotonic() > deadline:
            state = {p: re.findall(r"cluster_(?:state|known_nodes|slots_assigned):\S+", i)
                     for p, i in infos.items()}
            raise BenchError(f"the cluster was not ok on every node within 30 s: {state}")
        time.sleep(0.2)


# ---------------------------------------------------------------- vigia and wrk


def post_check(port: int) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/check", data=PROBE,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def allows_one(name: str, port: int, within_s: float = 10.0) -> None:
    """A row must allow a first check before it is measured: a service that answers every
    check with an error is fast, and wrk counts errors as non-2xx like denies. A 5xx is
    asked again for up to `within_s` (the store connection may still be coming up)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            status, body = post_check(port)
        except OSError as e:
            raise BenchError(f"{name}: a first check failed: {e}") from e
        if status == 200:
            try:
                allowed = json.loads(body).get("allowed", True)
            except ValueError:
                allowed = True
            if allowed is False:
                raise BenchError(f"{name}: a first check was denied: {body[:300]!r}")
            return
        if status >= 500 and time.monotonic() < deadline:
            time.sleep(0.2)
            continue
        raise BenchError(f"{name}: a first check answered {status}: {body[:300]!r}")


def metrics(port: int) -> dict[str, float]:
    """The counters of vigia's /metrics this report uses: decisions by decision, denies by
    limit, cluster releases by result, store errors by kind, over-limit cache answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^(\w+)(?:\{([^}]*)\})?\s+(\S+)", line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        try:
            v = float(value)
        except ValueError:
            continue
        if name == "vigia_decisions_total":
            key = "decisions " + label(labels, "decision")
        elif name == "vigia_blocks_total":
            key = "denied by limit " + label(labels, "limit")
        elif name == "vigia_cluster_releases_total":
            key = "cluster releases " + label(labels, "result")
        elif name == "vigia_store_errors_total":
            key = "store errors " + label(labels, "kind")
        elif name == "vigia_over_limit_cache_answers_total":
            key = "over-limit cache answers"
        elif name == "vigia_degraded_decisions_total":
            key = "degraded decisions"
        else:
            continue
        out[key] = out.get(key, 0.0) + v
    return out


def drain_releases(port: int, limit_s: float = 60.0) -> float:
    """Waits until vigia's cluster release counters stay still for 0.5 s (at most
    `limit_s`); returns the seconds until they last moved."""
    def released() -> float:
        return sum(v for k, v in metrics(port).items() if k.startswith("cluster releases"))

    t0 = time.monotonic()
    last, moved = released(), t0
    while time.monotonic() - t0 < limit_s:
        time.sleep(0.1)
        now = released()
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved >= 0.5:
            break
    return moved - t0


def label(labels: str, name: str) -> str:
    m = re.search(rf'\b{name}="([^"]*)"', labels)
    return m.group(1) if m else "?"



def wrk(port: int, threads: int, conns: int, dur: float, log: Path) -> tuple[str, float]:
    """Runs wrk with benches/wrk/cluster.lua; returns its output and the CPU seconds it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{conns}", f"-d{dur}s", "--latency", "-s", str(SCRIPT),
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
        self.rules = tmp / "rules"
        self.rules.mkdir()
        for f in RULES[args.rules].glob("*.toml"):
            # No gateway: its per-node bucket (2000/s for coupon_claim) would answer most of
            # the load without a store call, and the store is what is measured.
            text = re.sub(r"(?m)^gateway = .*$", "", f.read_text())
            (self.rules / f.name).write_text(text)
        self.stores: dict[str, Store] = {}
        self.runs = 0

    def start_stores(self) -> None:
        """Starts the Redis of every row; each is registered before it starts, so that
        `stop` also stops what a failed start left running."""
        if "redis" in self.args.rows:
            single: list[RedisServer] = []
            self.stores["redis"] = Store("redis", single)
            single.append(RedisServer(self.tmp, free_port(), cluster=False))
            self.stores["redis"].url = single[0].url
        if "cluster" in self.args.rows:
            masters: list[RedisServer] = []
            self.stores["cluster"] = Store("redis_cluster", masters)
            for p in free_cluster_ports(self.args.masters):
                masters.append(RedisServer(self.tmp, p, cluster=True))
            self.stores["cluster"].url = ",".join(s.url for s in masters)
            print(f"creating the cluster on ports {[s.port for s in masters]} …",
                  file=sys.stderr, flush=True)
            start_cluster(self.tmp, masters)

    def stop(self) -> None:
        for store in self.stores.values():
            store.stop()

    def start_vigia(self, row: str) -> Service:
        store = self.stores[row]
        port = free_port()
        self.runs += 1
        env = {"VIGIA_LISTEN": f"127.0.0.1:{port}", "VIGIA_RULES_DIR": str(self.rules),
               "VIGIA_STORE": store.backend, "VIGIA_REDIS_URL": store.url,
               "VIGIA_DATA_DIR": str(self.tmp / f"data-{self.runs}"), "RUST_LOG": "warn"}
        return Service(f"vigia ({store.backend})",
                       [str(REPO / "target" / "release" / "vigia"), "--config", "config.toml"],
                       env, port, self.tmp / f"vigia-{row}.log")

    def measure(self, name: str) -> Row:
        a = self.args
        store = self.stores[name]
        svc = self.start_vigia(name)
        log = self.tmp / "wrk.log"
        try:
            store.flushall()
            allows_one(name, svc.port)
            wrk(svc.port, 1, 4, 2, log)  # warm-up: connections, scripts loaded, caches
            store.flushall()
            m0 = metrics(svc.port)
            c0 = [s.command_calls() for s in store.servers]
            v0 = tree_ticks(svc.pid)
            r0 = [cpu_ticks(s.pid) for s in store.servers]
            t0 = time.monotonic()
            out, wrk_cpu = wrk(svc.port, a.threads, a.conns, a.duration, log)
            # Releases are queued off the answer's path and run one at a time: wait until
            # the queue the run left has drained (the release counters stop moving), so the
            # CPU and the commands they cost are counted with the run.
            row_drain = drain_releases(svc.port)
            elapsed = time.monotonic() - t0
            v1 = tree_ticks(svc.pid)
            r1 = [cpu_ticks(s.pid) for s in store.servers]
            c1 = [s.command_calls() for s in store.servers]
            m1 = metrics(svc.port)
            row = parse_wrk(name, out)
            row.drain_s = row_drain
            if row.requests == 0:
                raise BenchError(f"{name}: wrk completed no request; {tail(svc.log)}")
            per_req = 1e6 / HZ / row.requests
            # A process of the tree that started during the run counts from zero.
            row.vigia_us = sum(t - v0.get(p, 0) for p, t in v1.items()) * per_req
            row.wrk_us = wrk_cpu * 1e6 / row.requests
            for s, a0, a1, k0, k1 in zip(store.servers, r0, r1, c0, c1):
                d = {c: n - k0.get(c, 0) for c, n in k1.items()}
                d["info"] = 0  # the benchmark's own INFO commandstats
                evals = d.get("evalsha", 0) + d.get("eval", 0)
                row.masters.append(Master(
                    port=s.port, cpu_us=(a1 - a0) * per_req,
                    core_share=(a1 - a0) / HZ / elapsed,
                    evalsha=evals / row.requests, cmds=sum(d.values()) / row.requests,
                    keys=s.dbsize()))
            row.decisions = {k: (v - m0.get(k, 0.0)) / row.requests for k, v in m1.items()}
            return row
        finally:
            svc.stop()


# ---------------------------------------------------------------- report



def med(rows: list[Row], f) -> float:
    return median([f(r) for r in rows])


def report(runs: dict[str, list[Row]], args: argparse.Namespace) -> None:
    reps = (f"; every figure the median of {args.repeat} interleaved repetitions"
            if args.repeat > 1 else "")
    print(f"\nvigia on one Redis vs on a {args.masters}-master Redis Cluster: scene coupon_claim "
          f"({RULES[args.rules].relative_to(REPO)}, no gateway), benches/wrk/cluster.lua,\nwrk -t{args.threads} "
          f"-c{args.conns} -d{args.duration}s, {os.cpu_count()} CPUs shared by every "
          f"process{reps}")
    print("CPU in µs per check (utime + stime over the measured run / checks completed); "
          "redis Σ = all masters, max = the busiest master")
    head = (f"{'row':<8} {'checks/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'checks':>8} "
            f"{'non-2xx':>8} {'sockerr':>7} {'vigia':>7} {'redis Σ':>8} {'max':>7} "
            f"{'1-core ceiling':>14} {'wrk':>6} {'drain s':>7}")
    print(head)
    print("-" * len(head))
    for n, rs in runs.items():
        ceiling = med(rs, lambda r: 1e6 / r.max_master_us if r.max_master_us else 0.0)
        print(f"{n:<8} {med(rs, lambda r: r.rps):>9.0f} {med(rs, lambda r: r.p50_ms):>7.2f} "
              f"{med(rs, lambda r: r.p99_ms):>7.2f} {med(rs, lambda r: r.requests):>8.0f} "
              f"{med(rs, lambda r: r.non2xx):>8.0f} {med(rs, lambda r: r.socket_errors):>7.0f} "
              f"{med(rs, lambda r: r.vigia_us):>7.1f} {med(rs, lambda r: r.redis_us):>8.1f} "
              f"{med(rs, lambda r: r.max_master_us):>7.1f} {ceiling:>12.0f}/s "
              f"{med(rs, lambda r: r.wrk_us):>6.1f} {med(rs, lambda r: r.drain_s):>7.1f}")
    print("  1-core ceiling: 1e6 / the busiest master's µs per check, the checks/s at which "
          "that master would fill one core of its own\n  drain s: after wrk ended, "
          "the seconds vigia still ran queued cluster releases; their CPU and commands are "
          "counted")

    print("\nper redis-server (master), per check")
    head = (f"{'row':<8} {'master':>7} {'CPU µs':>7} {'share':>6} {'core %':>7} "
            f"{'evalsha':>8} {'cmds':>6} {'keys':>8}")
    print(head)
    print("-" * len(head))
    for n, rs in runs.items():
        for i, m in enumerate(rs[0].masters):
            col = [r.masters[i] for r in rs]
            share = median([r.masters[i].cpu_us / r.redis_us if r.redis_us else 0.0 for r in rs])
            print(f"{n:<8} {':' + str(m.port):>7} {median([c.cpu_us for c in col]):>7.1f} "
                  f"{share:>6.0%} {median([c.core_share for c in col]):>7.0%} "
                  f"{median([c.evalsha for c in col]):>8.2f} {median([c.cmds for c in col]):>6.2f} "
                  f"{median([c.keys for c in col]):>8.0f}")
        if len(rs[0].masters) > 1:
            print(f"{n:<8} {'Σ':>7} {med(rs, lambda r: r.redis_us):>7.1f} {'':>6} "
                  f"{med(rs, lambda r: sum(m.core_share for m in r.masters)):>7.0%} "
                  f"{med(rs, lambda r: sum(m.evalsha for m in r.masters)):>8.2f} "
                  f"{med(rs, lambda r: sum(m.cmds for m in r.masters)):>6.2f} "
                  f"{med(rs, lambda r: sum(m.keys for m in r.masters)):>8.0f}")
    print("  share: of the row's Redis CPU; core %: of one core over the run; evalsha: "
          "EVALSHA + EVAL calls; cmds: every command, those the\n  scripts run included "
          "(INFO commandstats counts both); keys: DBSIZE at the end of the run")

    keys = sorted({k for rs in runs.values() for r in rs for k, v in r.decisions.items() if v})
    if keys:
        print("\nvigia's /metrics over the measured run, per check (counter deltas / checks)")
        width = max(len(k) for k in keys)
        print(f"{'':<{width}} " + " ".join(f"{n:>8}" for n in runs))
        for k in keys:
            print(f"{k:<{width}} " + " ".join(
                f"{med(rs, lambda r: r.decisions.get(k, 0.0)):>8.3f}" for rs in runs.values()))
        print("  cluster releases: a denied check gives back what its other slot groups "
              "reserved, one script per group; an allow commits its record in the user's group\n"
              "  (released: it held one; committed: made final; none: nothing was "
              "held; dropped: never settled)\n  the share denied grows with the rate (a user "
              "drawn twice within 10 s is denied by user_10s),\n  so rows measured at different "
              "rates deny different shares")

    for n, rs in runs.items():
        degraded = med(rs, lambda r: r.decisions.get("degraded decisions", 0.0))
        if degraded > 0.001:
            print(f"\nWARNING {n}: {degraded:.1%} of checks were decided without the store "
                  f"(store timeouts, the breaker open: see 'store errors'); their Redis work is "
                  f"missing from the CPU per check. The machine was probably overloaded "
                  f"(another process on the CPUs?): measure again.")

    if args.repeat > 1:
        print("\nevery repetition, in order: checks/s, redis Σ µs, busiest master µs per check")
        for n, rs in runs.items():
            print(f"{n:<8} " + "   ".join(f"{r.rps:>6.0f} {r.redis_us:>5.1f} {r.max_master_us:>5.1f}"
                                          for r in rs))

    if "redis" in runs and "cluster" in runs:
        single, clus = runs["redis"], runs["cluster"]
        s_us, c_us = med(single, lambda r: r.redis_us), med(clus, lambda r: r.redis_us)
        c_max = med(clus, lambda r: r.max_master_us)
        print(f"\ncluster against one Redis: Redis CPU per check {c_us:.1f} µs summed over "
              f"{args.masters} masters vs {s_us:.1f} µs ({c_us / s_us:.2f}×);\nthe busiest master "
              f"{c_max:.1f} µs ({c_max / s_us:.2f}× one Redis), so its core ceiling is "
              f"{s_us / c_max:.2f}× one Redis's;\nEVALSHA per check "
              f"{med(clus, lambda r: sum(m.evalsha for m in r.masters)):.2f} vs "
              f"{med(single, lambda r: sum(m.evalsha for m in r.masters)):.2f}; vigia {med(clus, lambda r: r.vigia_us):.1f} "
              f"µs vs {med(single, lambda r: r.vigia_us):.1f} µs per check; checks/s "
              f"{med(clus, lambda r: r.rps):.0f} vs {med(single, lambda r: r.rps):.0f} "
              f"(both on the same {os.cpu_count()} CPUs)")


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-d", "--duration", type=int, default=10, help="seconds per measured run (10)")
    p.add_argument("-c", "--conns", type=int, default=50, help="wrk connections (50)")
    p.add_argument("-t", "--threads", type=int, default=2, help="wrk threads (2)")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of: " + ", ".join(ROWS))
    p.add_argument("--rules", choices=sorted(RULES), default="shipped",
                   help="shipped: rules/ (limits, signals, trust, score); limits: benches/rules/cluster")
    p.add_argument("--masters", type=int, default=3, help="masters of the cluster row (3)")
    p.add_argument("--repeat", type=int, default=1,
                   help="measure every row N times, interleaved; report medians (1)")
    p.add_argument("--no-build", action="store_true", help="use target/release/vigia as it is")
    args = p.parse_args()
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown or not args.rows:
        p.error(f"unknown or no rows {unknown}; known: {ROWS}")
    args.rows = [r for r in ROWS if r in args.rows]  # always in the documented order
    if args.masters < 3:
        p.error("--masters must be at least 3 (redis-cli --cluster create needs three)")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args


def on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    args = parse_args()
    missing = [f"{t} (Debian package {pkg})" for t, pkg in TOOLS.items() if not shutil.which(t)]
    if not args.no_build and not shutil.which("cargo"):
        missing.append("cargo (rustup, or Debian package cargo)")
    if missing:
        print("benches/cluster.py needs, not on PATH: " + ", ".join(missing), file=sys.stderr)
        return 1
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "vigia"], cwd=REPO,
                       check=True)
    if not (REPO / "target" / "release" / "vigia").is_file():
        print("benches/cluster.py: target/release/vigia is not built (run without --no-build)",
              file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, on_sigterm)
    tmp = Path(tempfile.mkdtemp(prefix="vigia-cluster-"))
    bench = None
    runs: dict[str, list[Row]] = {name: [] for name in args.rows}
    try:
        bench = Bench(args, tmp)
        bench.start_stores()
        for rep in range(args.repeat):
            for name in args.rows:
                of = f" ({rep + 1}/{args.repeat})" if args.repeat > 1 else ""
                print(f"measuring {name}{of} …", file=sys.stderr, flush=True)
                runs[name].append(bench.measure(name))
        report(runs, args)
        return 0
    except (BenchError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(f"benches/cluster.py: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("benches/cluster.py: interrupted; stopping what it started", file=sys.stderr)
        return 130
    finally:
        if bench:
            bench.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
