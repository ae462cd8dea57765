#!/usr/bin/env python3
"""A coupon backend asking vigia before it grants a claim (Python 3, standard library only).

    python3 examples/client/claim.py --url http://127.0.0.1:8080 --user 10086 --calls 2

prints, with the shipped rules (coupon_claim: one claim per user per 10 s):

    granted
    denied: Agotado, vuelve mañana, retry after 10

`check()` asks once per user action and returns what the backend should do:

| vigia answers                                | action      | the backend                                   |
|----------------------------------------------|-------------|-----------------------------------------------|
| 200 `allow`                                  | `grant`     | grants the coupon                             |
| 429 `friendly_deny`                          | `deny`      | shows `message` and "retry after N" seconds   |
| 403 `challenge`                              | `challenge` | verifies the person (`challenge.kind`), reports `challenge_passed`, claims again |
| 200 `silent_deny`                            | `pretend`   | answers exactly as for a grant, grants nothing |
| 503 (`store_unavailable`, scene fail_close)  | `try_again` | shows "try again in N s", grants nothing      |
| timeout, connection error, other 5xx         | `on_unavailable` (the scene's choice: `try_again` for coupons, `grant` for cheap actions) |

A 400 or 401 is a bug in the call itself (a missing dimension, a wrong token): it raises
`CheckError` rather than guessing.

A challenge means vigia is unsure this is a person: `claim()` asks the person to prove it
(`verify_person`, a stand-in here for your captcha or SMS flow), reports the pass to
`/v1/events` with the admin token (`VIGIA_ADMIN_TOKEN` or `--admin-token`), and sends the
same claim again under the same idempotency key: a challenged claim consumed nothing, so
it is decided anew, and for the scene's `pass_ttl` that user on that device is not
challenged again. With a scene that challenges a fresh user it prints:

    challenged: captcha: Demuestra que eres tú
    verified: pass reported, claiming again
    granted

The idempotency key names the user's action (one per click on "claim", the same for
a retry or a double click's copy): vigia counts it once and answers a repeat with
`allow` and `duplicate_of`, so the backend must key its own grant on the same key to
grant once. That is what makes the one retry after a timeout here safe.
"""

import argparse
import datetime
import json
import os
import socket
import sys
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Optional

GRANT = "grant"
DENY = "deny"
PRETEND = "pretend"
TRY_AGAIN = "try_again"
CHALLENGE = "challenge"


class CheckError(Exception):
    """vigia refused the request itself (400, 401, 413, ...): fix the call."""


@dataclass
class Outcome:
    action: str                      # grant | deny | pretend | try_again | challenge
    message: Optional[str] = None    # the scene's deny message (deny) or challenge message
    challenge_kind: Optional[str] = None  # what to ask the person: captcha, sms… (challenge)
    retry_after: Optional[int] = None  # seconds (deny, try_again)
    request_id: Optional[str] = None
    duplicate_of: Optional[str] = None  # a repeat of an action already counted
    degraded: bool = False           # decided under a store failure (or not asked at all)

    def describe(self) -> str:
        """What the demo prints (and what a user would be shown, roughly)."""
        if self.action == GRANT:
            return "granted" + (" (repeat)" if self.duplicate_of else "")
        if self.action == DENY:
            return f"denied: {self.message}, retry after {self.retry_after}"
        if self.action == PRETEND:
            # The user sees "granted"; only the backend's own log knows.
            return "pretended: success shown, nothing granted"
        if self.action == CHALLENGE:
            shown = f": {self.message}" if self.message else ""
            return f"challenged: {self.challenge_kind}{shown}"
        after = f", retry after {self.retry_after}" if self.retry_after else ""
        return f"try again{after}"


def _retry_after(headers, body) -> Optional[int]:
    value = headers.get("Retry-After") if headers is not None else None
    if value is not None and value.strip().isdigit():
        return int(value)
    ms = body.get("retry_after_ms") if isinstance(body, dict) else None
    if isinstance(ms, int) and ms > 0:
        return max(1, (ms + 999) // 1000)
    return None


def _outcome(status: int, headers, raw: bytes) -> Outcome:
    try:
        body = json.loads(raw.decode("utf-8")) if raw else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    decision = body.get("decision")
    common = {
        "request_id": body.get("request_id"),
        "duplicate_of": body.get("duplicate_of"),
        "degraded": bool(body.get("degraded")),
    }
    if status == 200 and decision == "allow":
        return Outcome(GRANT, **common)
    if status == 200 and decision == "silent_deny":
        return Outcome(PRETEND, **common)
    if status == 429:
        return Outcome(DENY, message=body.get("message"),
                       retry_after=_retry_after(headers, body), **common)
    if status == 403 and decision == "challenge":
        # Nothing was counted: the claim may be sent again once the person passed.
        ask = body.get("challenge") if isinstance(body.get("challenge"), dict) else {}
        return Outcome(CHALLENGE, message=ask.get("message"),
                       challenge_kind=ask.get("kind"), **common)
    if status == 503:
        # The scene fails closed while vigia's store is down: nothing is counted, so
        # nothing may be granted; the user can try again shortly.
        return Outcome(TRY_AGAIN, retry_after=_retry_after(headers, body), **common)
    if 400 <= status < 500:
        error = body.get("error") if isinstance(body.get("error"), dict) else {}
        raise CheckError(f"vigia answered {status}: {error.get('code')}: "
                         f"{error.get('message')} (field {error.get('field')})")
    raise _Unavailable(f"vigia answered {status}")


class _Unavailable(Exception):
    pass


def check(base_url: str, scene: str, *, user_id: str, device_id: str, ip: str,
          idempotency_key: str, activity_id: Optional[str] = None,
          user_created_at: Optional[str] = None, token: Optional[str] = None, timeout: float = 0.5, retries: int = 1,
          on_unavailable: str = TRY_AGAIN) -> Outcome:
    """Asks vigia about one user action and returns what to do.

    `timeout` bounds each attempt (seconds); a timeout or connection error is retried
    `retries` times with the same idempotency key (free: a repeat counts once), then
    `on_unavailable` decides: TRY_AGAIN (fail closed: coupons, stock, draws) or GRANT
    (fail open: cheap actions where refusing hurts more than abuse)."""
    if on_unavailable not in (TRY_AGAIN, GRANT):
        raise ValueError("on_unavailable must be TRY_AGAIN or GRANT")
    payload = {"scene": scene, "user_id": user_id, "device_id": device_id, "ip": ip,
               "idempotency_key": idempotency_key}
    if activity_id is not None:
        payload["activity_id"] = activity_id
    if user_created_at is not None:  # RFC 3339; without it a user vigia first sees is new
        payload["user_created_at"] = user_created_at
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(payload).encode("utf-8")
    url = base_url.rstrip("/") + "/v1/check"
    for _ in range(retries + 1):
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                return _outcome(resp.status, resp.headers, resp.read())
        except urllib.error.HTTPError as err:  # 4xx and 5xx arrive here
            try:
                return _outcome(err.code, err.headers, err.read())
            except _Unavailable:
                continue
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError):
            continue
    return Outcome(on_unavailable, degraded=True)


def verify_person(kind: Optional[str], message: Optional[str], user_id: str) -> bool:
    """STAND-IN: a real backend shows the person the challenge vigia asked for (`kind`:
    captcha, sms…, with `message`) and returns whether they passed it. This demo has no
    person to ask, so everyone passes."""
    return True


def _now_rfc3339() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def report_pass(base_url: str, *, user_id: str, device_id: Optional[str], scene: Optional[str],
                token: Optional[str], timeout: float = 0.5, retries: int = 1) -> bool:
    """Tells vigia the person passed a challenge (`challenge_passed`, admin auth): for the
    scene's `pass_ttl` that user, on that device, is not challenged again. Returns False
    when vigia could not be reached (the claim then stays challenged). The event id is made
    once, so a retry after a timeout is counted once."""
    event = {"event_id": f"pass-{uuid.uuid4()}", "type": "challenge_passed",
             "user_id": user_id, "occurred_at": _now_rfc3339()}
    if device_id is not None:
        event["device_id"] = device_id
    if scene is not None:
        event["scene"] = scene
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(event).encode("utf-8")
    url = base_url.rstrip("/") + "/v1/events"
    for _ in range(retries + 1):
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                return resp.status == 202
        except urllib.error.HTTPError as err:
            if 400 <= err.code < 500:
                # A wrong admin token or a scene that never challenges: fix the call.
                raise CheckError(f"vigia refused the pass ({err.code}): "
                                 f"{err.read().decode('utf-8', 'replace')}") from None
            continue
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError):
            continue
    return False


def claim(base_url: str, scene: str, *, user_id: str, device_id: str, ip: str,
          admin_token: Optional[str] = None, say=print, **check_args) -> Outcome:
    """One user action, challenge included: `check()`, and on a challenge the person is
    verified, the pass reported and the claim sent again with the same idempotency key
    (once: a claim challenged again after a reported pass is not granted)."""
    outcome = check(base_url, scene, user_id=user_id, device_id=device_id, ip=ip, **check_args)
    if outcome.action != CHALLENGE:
        return outcome
    say(outcome.describe())
    if not verify_person(outcome.challenge_kind, outcome.message, user_id):
        say("not verified: nothing granted")
        return outcome
    if not report_pass(base_url, user_id=user_id, device_id=device_id, scene=scene,
                       token=admin_token, timeout=check_args.get("timeout", 0.5)):
        say("verified, but vigia could not be told: nothing granted")
        return outcome
    say("verified: pass reported, claiming again")
    return check(base_url, scene, user_id=user_id, device_id=device_id, ip=ip, **check_args)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Claim a coupon through vigia, as a backend would.")
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--scene", default="coupon_claim")
    p.add_argument("--user", default="10086")
    p.add_argument("--device", default="a1b2c3d4e5")
    p.add_argument("--ip", default="203.0.113.7")
    p.add_argument("--activity", default="2026verano")
    p.add_argument("--created-at", default="2025-03-01T00:00:00Z",
                   help="the account's creation time, RFC 3339 (new accounts get half the quota)")
    p.add_argument("--calls", type=int, default=2, help="claims, each a new user action")
    p.add_argument("--timeout", type=float, default=0.5, help="seconds per attempt")
    p.add_argument("--fail-open", action="store_true",
                   help="grant when vigia cannot be reached (cheap actions only)")
    p.add_argument("--admin-token", default=os.environ.get("VIGIA_ADMIN_TOKEN"),
                   help="vigia's admin token, to report challenge passes "
                        "(default: $VIGIA_ADMIN_TOKEN; none needed from loopback without one)")
    args = p.parse_args(argv)
    for _ in range(args.calls):
        try:
            outcome = claim(args.url, args.scene, user_id=args.user, device_id=args.device,
                            ip=args.ip, admin_token=args.admin_token,
                            say=lambda line: print(line, flush=True),
                            activity_id=args.activity, user_created_at=args.created_at,
                            idempotency_key=str(uuid.uuid4()),
                            token=os.environ.get("VIGIA_CHECK_TOKEN"), timeout=args.timeout,
                            on_unavailable=GRANT if args.fail_open else TRY_AGAIN)
        except CheckError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(outcome.describe(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
