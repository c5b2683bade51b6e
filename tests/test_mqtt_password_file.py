"""A Mosquitto password file works unchanged (``mqtt_password_file``).

Why: a fleet moved from Mosquitto brings the file ``mosquitto_passwd`` wrote;
its users must log in with the same passwords. The file is made here by the
real ``mosquitto_passwd`` (Debian ``mosquitto``) in both hash forms it writes
($7$ PBKDF2-SHA512, Mosquitto 2's default; $6$ SHA-512, Mosquitto 1.6's), and
paho connects with right and wrong passwords. A file unimq cannot use stops
`unimq up` with a message naming the line.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import _unimq_command
from mqtt_fixtures import Paho, config_file

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not shutil.which("mosquitto_passwd"), reason="mosquitto is not installed (make test does)"),
]


def _passwd(*args: str) -> None:
    subprocess.run(["mosquitto_passwd", *args], check=True, timeout=30, capture_output=True)


@pytest.fixture
def server(unimq_server, tmp_path):
    pw = tmp_path / "passwd"
    _passwd("-c", "-b", str(pw), "alice", "s3cret")  # $7$ (default)
    _passwd("-H", "sha512", "-b", str(pw), "bob", "hunter2")  # $6$ (old default)
    cfg = config_file(tmp_path, f'mqtt_allow_anonymous = false\nmqtt_password_file = "{pw}"\n'
                                '[mqtt_users]\ncarol = "plain-text"\n')
    return unimq_server("--config", cfg)


def _connect(port: int, user: str | None, password: str | None, v5: bool = False):
    c = Paho(port, v5=v5, connect=False)
    if user is not None:
        c.c.username_pw_set(user, password)
    return c, c.connect(expect_ok=False)


@pytest.mark.parametrize("v5", [False, True])
def test_users_of_a_mosquitto_password_file_log_in(server, v5: bool) -> None:
    port = server.ports["mqtt"]
    for user, password in (("alice", "s3cret"), ("bob", "hunter2"), ("carol", "plain-text")):
        c, (_, rc, _) = _connect(port, user, password, v5)
        assert not rc.is_failure, (user, rc)
        c.disconnect()
    for user, password in (("alice", "hunter2"), ("bob", ""), ("dave", "s3cret"), (None, None)):
        c, (_, rc, _) = _connect(port, user, password, v5)
        assert rc.is_failure, (user, rc)
        if user is not None:  # anonymous: 0x87 not authorized (v5) / 5 (3.1.1)
            assert "bad user name or password" in str(rc).lower(), (user, rc)
        c.c.loop_stop()


def test_a_broken_password_file_stops_unimq_with_the_line(tmp_path) -> None:
    pw = tmp_path / "passwd"
    pw.write_text("alice:$7$101$not-base64!$x\n")
    cfg = config_file(tmp_path, f'mqtt_password_file = "{pw}"\n')
    out = subprocess.run([*_unimq_command(), "up", "--config", cfg, "--data-dir", str(tmp_path / "d"),
                          "--host", "127.0.0.1", "--mqtt-port", "0", "--amqp-port", "0", "--http-port", "0",
                          "--grpc-port", "0", "--namesrv-port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "line 1" in out.stderr and "alice" in out.stderr
