#!/usr/bin/env python3
"""Follows README.md as a stranger would, on a fresh clone, and fails where it does not hold.

Every ```sh block of README.md is run, in order, in a fresh `git clone` of this
repository, with bash (`set -euo pipefail`); it must succeed. An HTML comment on the line
before a block's fence says more about it (GitHub does not render it):

  <!-- readme-check: serve -->        start the block in the background (the service) and
                                      wait until http://127.0.0.1:8080/readyz answers 200
  <!-- readme-check: output -->       its `# ` lines are the exact standard output expected
  <!-- readme-check: answer -->       (a json block) what the previous sh block printed:
                                      every scalar shown must be the one answered, and every
                                      object shown with a "name" must be in the answer
  <!-- readme-check: http-answer -->  (a plain block) the previous sh block run again with
                                      `curl -si`: status, each header shown, the body's scalars
  <!-- readme-check: skip: WHY -->    not run; WHY is printed

Values shown with an ellipsis (…) and ids that differ on every run (request_id,
rules_version, retry_after_ms) are not compared. The README must not link outside the
repository. A Redis of its own on a free port is started and named to every command
through VIGIA_REDIS_URL, so `vigia keys sweep` never touches another Redis.

Usage: scripts/readme-check.py [--keep]   (from anywhere in the repository; needs git,
cargo, curl, python3 and redis-server on PATH; builds the release binary; the clone shares
this checkout's target/ folder so a warm build is reused).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY_URL = "http://127.0.0.1:8080/readyz"
IGNORED_FIELDS = {"request_id", "rules_version", "retry_after_ms"}
DIRECTIVE = re.compile(r"<!--\s*readme-check:\s*(.*?)\s*-->")


class Failure(Exception):
    pass


def blocks(text):
    """(line number, language, directive or None, body) for every fenced block."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start, lang = i, fence.group(1)
        directive = None
        if start > 0:
            m = DIRECTIVE.search(lines[start - 1])
            directive = m.group(1) if m else None
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise Failure(f"README.md:{start + 1}: fence never closed")
        out.append((start + 1, lang, directive, "\n".join(body)))
        i += 1
    # A directive that is not right above a fence is a typo that would skip a check.
    for n, line in enumerate(lines):
        if DIRECTIVE.search(line) and not (n + 1 < len(lines) and lines[n + 1].startswith("```")):
            raise Failure(f"README.md:{n + 1}: readme-check directive not right above a fence")
    return out


def links_outside(text, root):
    """Markdown links that leave the repository (or name a file `root` does not have)."""
    bad = []
    for n, line in enumerate(text.split("\n"), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"^[a-z]+:", target) or target.startswith("/") or ".." in target:
                bad.append(f"README.md:{n}: links {target}")
            elif not os.path.exists(os.path.join(root, target.split("#")[0])):
                bad.append(f"README.md:{n}: links {target}, which the repository does not have")
        if "../shared" in line:
            bad.append(f"README.md:{n}: names ../shared, which a clone does not have")
    return bad


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(workdir):
    if shutil.which("redis-server") is None:
        raise Failure("redis-server is not on PATH (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"redis://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise Failure("redis-server did not start")


def run(script, cwd, env, timeout=1800):
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def wait_ready(proc, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failure(f"the service exited ({proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(READY_URL, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise Failure(f"{READY_URL} did not answer 200 within {timeout_s} s")


def scalar_pairs(text):
    """`"key":scalar` pairs of the outermost object in `text`, outside nested ones."""
    inner = text[text.find("{") + 1:text.rfind("}")]
    while True:
        reduced = re.sub(r"\[[^\[\]]*\]|\{[^{}]*\}", "", inner)
        if reduced == inner:
            break
        inner = reduced
    return re.findall(r'"(\w+)":\s*(null|true|false|-?\d+(?:\.\d+)?|"[^"]*")', inner)


def compare_json(shown, actual, where):
    """Each scalar and each named object `shown` must be what `actual` holds."""
    problems = []
    shown = shown.strip()
    for key, value in scalar_pairs(shown):
        if key in IGNORED_FIELDS or "…" in value:
            continue
        if key not in actual:
            problems.append(f"{where}: shows {key}, the answer has no such field")
        elif actual[key] != json.loads(value):
            problems.append(f"{where}: shows {key}={value}, the answer has {json.dumps(actual[key])}")
    named = {}
    for field in ("limits", "signals"):
        for item in actual.get(field) or []:
            named[item.get("name")] = item
    for obj in re.findall(r"\{[^{}]*\}", shown):
        try:
            item = json.loads(obj)
        except json.JSONDecodeError:
            continue
        if "name" in item:
            got = named.get(item["name"])
            if got is None:
                problems.append(f"{where}: shows {item['name']}, the answer has no limit or signal so named")
            elif any(got.get(k) != v for k, v in item.items()):
                problems.append(f"{where}: shows {obj}, the answer has {json.dumps(got)}")
    for key, obj in re.findall(r'"(\w+)":(\{[^{}]*\})', shown):
        item = json.loads(obj)
        if "name" not in item and any((actual.get(key) or {}).get(k) != v for k, v in item.items()):
            problems.append(f"{where}: shows {key}={obj}, the answer has {json.dumps(actual.get(key))}")
    return problems


def compare_http(shown, raw, where):
    """Status, each header shown, and the body's scalars."""
    head, _, body = raw.replace("\r\n", "\n").partition("\n\n")
    status_line, *header_lines = head.split("\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    shown_head, _, shown_body = shown.partition("\n\n")
    shown_status, *shown_headers = shown_head.split("\n")
    problems = []
    if shown_status.split()[1] != status_line.split()[1]:
        problems.append(f"{where}: shows {shown_status!r}, the answer is {status_line!r}")
    for line in shown_headers:
        name, _, value = line.partition(":")
        got = headers.get(name.strip().lower())
        if got != value.strip():
            problems.append(f"{where}: shows {line!r}, the answer has {name.strip()}: {got!r}")
    try:
        actual = json.loads(body)
    except json.JSONDecodeError:
        return problems + [f"{where}: the answer's body is not JSON: {body[:200]!r}"]
    return problems + compare_json(shown_body, actual, where)


def expected_output(script):
    """The `# ` lines after the last command of a block: its expected standard output."""
    return [line[2:] for line in script.split("\n") if line.startswith("# ")]


def main():
    keep = "--keep" in sys.argv
    work = tempfile.mkdtemp(prefix="readme-check-")
    clone = os.path.join(work, "vigia")
    subprocess.run(["git", "clone", "--quiet", REPO, clone], check=True)
    # The README of the clone: what is committed is what a stranger gets.
    with open(os.path.join(clone, "README.md"), encoding="utf-8") as f:
        text = f.read()
    problems = links_outside(text, clone)
    # A fresh clone of the sources; the build cache of this checkout, so that a warm
    # target/ is not built again (what is checked is the commands, not the compiler).
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    os.makedirs(target, exist_ok=True)
    os.symlink(target, os.path.join(clone, "target"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIA_") and k != "CARGO_TARGET_DIR"}
    redis, env["VIGIA_REDIS_URL"] = start_redis(work)
    service = None
    previous_sh = None
    ran = skipped = 0
    try:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", 8080)) == 0:
                raise Failure("something already listens on 127.0.0.1:8080, where README's service listens")
        for line, lang, directive, body in blocks(text):
            where = f"README.md:{line}"
            if directive and directive.startswith("skip"):
                print(f"{where}: skipped: {directive.partition(':')[2].strip()}")
                skipped += 1
                continue
            if directive == "serve":
                print(f"{where}: starting the service: {body.strip()}", flush=True)
                service = subprocess.Popen(["bash", "-c", body], cwd=clone, env=env,
                                           stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "service.log"), "w"),
                                           start_new_session=True)
                wait_ready(service, 2400)
                ran += 1
                continue
            if directive == "answer":
                if previous_sh is None:
                    raise Failure(f"{where}: an answer with no command before it")
                try:
                    actual = json.loads(previous_sh[1])
                except json.JSONDecodeError:
                    problems.append(f"{where}: the command before printed no JSON: {previous_sh[1][:300]!r}")
                    continue
                problems += compare_json(body, actual, where)
                ran += 1
                continue
            if directive == "http-answer":
                again = previous_sh[0].replace("curl -s ", "curl -si ", 1)
                code, out, err = run(again, clone, env)
                if code != 0:
                    problems.append(f"{where}: `curl -si` again failed ({code}): {err.strip()}")
                else:
                    problems += compare_http(body, out, where)
                ran += 1
                continue
            if lang != "sh":
                if directive:
                    raise Failure(f"{where}: unknown readme-check directive {directive!r}")
                continue
            print(f"{where}: running {body.strip().splitlines()[0]}", flush=True)
            code, out, err = run(body, clone, env)
            ran += 1
            previous_sh = (body, out)
            if code != 0:
                problems.append(f"{where}: exit {code}\n  stdout: {out.strip()[-800:]}\n  stderr: {err.strip()[-800:]}")
                continue
            if directive == "output":
                want, got = expected_output(body), out.rstrip("\n").split("\n")
                if want != got:
                    problems.append(f"{where}: prints {got}, README shows {want}")
            elif directive:
                raise Failure(f"{where}: unknown readme-check directive {directive!r}")
    except Failure as e:
        problems.append(str(e))
    finally:
        if service is not None and service.poll() is None:
            os.killpg(service.pid, signal.SIGTERM)
            try:
                service.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(service.pid, signal.SIGKILL)
        redis.kill()
        if problems and os.path.exists(os.path.join(work, "service.log")):
            with open(os.path.join(work, "service.log")) as f:
                tail = f.read()[-2000:]
            if tail.strip():
                print("service stderr (last 2000 characters):\n" + tail)
        if keep:
            print(f"clone kept in {clone}")
        else:
            os.unlink(os.path.join(clone, "target"))
            shutil.rmtree(work, ignore_errors=True)
    for p in problems:
        print(f"FAIL {p}")
    print(f"readme-check: {ran} blocks checked, {skipped} skipped, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
