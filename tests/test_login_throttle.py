"""Issue 19, traffic control: repeated failed logins from one address are slowed down.

- the counting itself (sans-io, a hand-driven clock): the threshold, the doubling delay and
  its bound, the window, a success clearing the count, doors and addresses kept apart,
  loopback left alone unless asked for;
- against a real `unimq up` with httpx (HTTP Basic): an address that failed enough times
  waits before its next login is answered, while a client from another address is answered
  at once (asserted by the order the answers arrive in and by the server's
  `unimq_login_throttled_total` counter, not by timing thresholds), and a successful login
  clears the count.
"""

from __future__ import annotations

import re
import threading
import time

import httpx

from gateway.access.login_throttle import LoginThrottle, address_of
from test_security_http import ADMIN, _admin, _bootstrap, _user


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_address_of_peers() -> None:
    assert address_of("10.0.0.7:4242") == "10.0.0.7"
    assert address_of("[::1]:4242") == "::1"
    assert address_of("::1") == "::1"
    assert address_of("10.0.0.7") == "10.0.0.7"


def test_delay_grows_after_the_threshold_is_bounded_and_forgotten() -> None:
    clock = Clock()
    t = LoginThrottle(failures=3, window_s=60, max_delay_s=1.0, clock=clock, loopback=True)
    delays = []
    for _ in range(8):
        delays.append(t.delay("mqtt", "10.0.0.7:5000"))
        t.failed("mqtt", "10.0.0.7:5001")  # another port of the same address counts too
    assert delays == [0, 0, 0, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert t.delay("mqtt", "10.0.0.8:5000") == 0  # another address
    assert t.delay("amqp", "10.0.0.7:5000") == 0  # another door
    clock.now += 61
    assert t.delay("mqtt", "10.0.0.7:5000") == 0  # the window passed


def test_loopback_is_left_alone_unless_asked_for() -> None:
    t = LoginThrottle(failures=1, clock=Clock())
    for peer in ("127.0.0.1:5000", "[::1]:5000", "127.0.0.2"):
        t.failed("http", peer)
        t.failed("http", peer)
        assert t.delay("http", peer) == 0
    t = LoginThrottle(failures=1, clock=Clock(), loopback=True)
    t.failed("http", "127.0.0.2:5000")
    assert t.delay("http", "127.0.0.2:6000") == 0.1


def test_success_clears_and_zero_disables() -> None:
    t = LoginThrottle(failures=1, clock=Clock(), loopback=True)
    t.failed("http", "1.2.3.4")
    assert t.delay("http", "1.2.3.4") > 0
    t.succeeded("http", "1.2.3.4")
    assert t.delay("http", "1.2.3.4") == 0
    off = LoginThrottle(failures=0, clock=Clock(), loopback=True)
    for _ in range(100):
        off.failed("http", "1.2.3.4")
    assert off.delay("http", "1.2.3.4") == 0


def _throttled(admin: httpx.Client) -> int:
    m = re.search(r'^unimq_login_throttled_total\{protocol="http"\} (\S+)$', admin.get("/metrics").text, re.M)
    return int(float(m.group(1))) if m else 0


def test_failed_basic_logins_slow_down_that_address_only(unimq_server) -> None:
    server = unimq_server("--set", "login_throttle_failures=2", "--set", "login_throttle_max_delay_s=4",
                          "--set", "login_throttle_loopback=true")
    _bootstrap(server)
    admin = _admin(server)
    _user(admin, "alice", "alice-pw", ("topic", "orders", "publish"))
    # the attacker comes from 127.0.0.2 (still loopback), everyone else from 127.0.0.1
    attacker = httpx.Client(base_url=server.url(), auth=("alice", "guess"), timeout=30,
                            transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    url = "/v1/topics/orders/messages"
    for _ in range(2):  # up to the threshold: answered at once, nothing throttled
        assert attacker.post(url, content=b"x").status_code == 401
    assert _throttled(admin) == 0
    for _ in range(4):  # beyond it: each try waits (0.1, 0.2, 0.4, 0.8 s), and is counted
        assert attacker.post(url, content=b"x").status_code == 401
    assert _throttled(admin) == 4

    # the next try waits 1.6 s; meanwhile another address's clients are answered at once
    order: list[str] = []
    lock = threading.Lock()

    def guess() -> None:
        r = attacker.post(url, content=b"x")
        with lock:
            order.append(f"attacker {r.status_code}")

    th = threading.Thread(target=guess)
    th.start()
    deadline = time.monotonic() + 30
    while _throttled(admin) < 5 and time.monotonic() < deadline:  # the attempt is waiting
        time.sleep(0.01)
    assert _throttled(admin) == 5
    with httpx.Client(base_url=server.url(), timeout=30) as other:
        r1 = other.post(url, content=b"x", auth=("alice", "alice-pw"))
        r2 = other.post(url, content=b"x", auth=("alice", "wrong"))
    with lock:
        order.append(f"other {r1.status_code} {r2.status_code}")
    th.join(30)
    assert order == ["other 200 401", "attacker 401"], order

    # the right password from the attacker's address (still made to wait) clears its count
    good = httpx.Client(base_url=server.url(), auth=("alice", "alice-pw"), timeout=30,
                        transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    assert good.post(url, content=b"x").status_code == 200
    assert _throttled(admin) == 6
    assert attacker.post(url, content=b"x").status_code == 401  # counted from 0 again: no wait
    assert _throttled(admin) == 6
    for c in (attacker, good, admin):
        c.close()
