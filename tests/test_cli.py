"""The `unimq` CLI contract: settings precedence, `up` output, /healthz, clean shutdown.

Later issues and every door's tests rely on these behaviours, so they are
tested through a real process and real sockets.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from core_broker.config import FlushMode, StoreConfig
from unimq.settings import TopicDecl, TopicType, UnimqSettings, load_settings

from conftest import REPO_ROOT, UnimqProcess, _unimq_command

needs_store = pytest.mark.skipif(
    not (REPO_ROOT / "core_broker" / "message_store.py").exists(),
    reason="core_broker.message_store is not written yet",
)


def _get(url: str, timeout: float = 10.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _abort_marker(data_dir: Path) -> Path:
    """Where the store keeps its abort marker, asked of the store itself (never guessed)."""
    from core_broker.message_store import MessageStore

    return MessageStore(StoreConfig(data_dir=data_dir)).abort_marker_path


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- settings -------------------------------------------------------------------------


def test_defaults_match_the_cli_contract() -> None:
    s = load_settings(None, {})
    assert (s.mqtt_port, s.amqp_port, s.http_port, s.grpc_port, s.namesrv_port) == (1883, 5672, 8080, 8081, 9876)
    assert s.host == "127.0.0.1"
    assert s.store.flush is FlushMode.ASYNC
    assert s == UnimqSettings()


def test_toml_file_sets_every_section(tmp_path: Path) -> None:
    cfg = _write(
        tmp_path / "unimq.toml",
        """
host = "0.0.0.0"
http_port = 18080
mqtt_port = 0
auto_create_topics = false
default_queue_count = 4
log_level = "DEBUG"

[store]
data_dir = "/tmp/somewhere"
flush = "sync"
commitlog_segment_size = 65536
retention_hours = 1

[[topics]]
name = "orders"
queues = 2
type = "fifo"

[[topics]]
name = "events"
""",
    )
    s = load_settings(cfg, {})
    assert s.host == "0.0.0.0"
    assert s.http_port == 18080 and s.mqtt_port == 0 and s.amqp_port == 5672
    assert s.auto_create_topics is False
    assert s.log_level == "debug"
    assert s.store.data_dir == Path("/tmp/somewhere")
    assert s.store.flush is FlushMode.SYNC
    assert s.store.commitlog_segment_size == 65536
    assert s.store.retention_hours == 1.0 and isinstance(s.store.retention_hours, float)
    assert s.topics == [
        TopicDecl("orders", 2, TopicType.FIFO),
        TopicDecl("events", 4, TopicType.NORMAL),  # default_queue_count applies
    ]


def test_flags_override_the_file(tmp_path: Path) -> None:
    cfg = _write(
        tmp_path / "unimq.toml",
        'http_port = 18080\nhost = "0.0.0.0"\n[store]\nflush = "sync"\ndata_dir = "from-file"\n',
    )
    s = load_settings(cfg, {"http_port": 0, "flush": "async", "data_dir": tmp_path / "flag", "host": None})
    assert s.http_port == 0
    assert s.store.flush is FlushMode.ASYNC
    assert s.store.data_dir == tmp_path / "flag"
    assert s.host == "0.0.0.0"  # a flag left unset (None) does not hide the file's value


def test_dotted_store_override() -> None:
    s = load_settings(None, {"store.flush_interval_ms": 50})
    assert s.store.flush_interval_ms == 50


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("htp_port = 1\n", "'htp_port'"),
        ("[store]\nflush_mode = 'sync'\n", "'flush_mode'"),
        ("[[topics]]\nname = 'a'\npartitions = 3\n", "'partitions'"),
        ("data_dir = 'x'\n", "[store]"),  # a store knob at the top level says where it belongs
    ],
)
def test_unknown_keys_are_errors_naming_the_key(tmp_path: Path, text: str, needle: str) -> None:
    cfg = _write(tmp_path / "bad.toml", text)
    with pytest.raises(ValueError) as info:
        load_settings(cfg, {})
    assert needle in str(info.value)


def test_unknown_override_is_an_error() -> None:
    with pytest.raises(ValueError, match="'no_such_knob'"):
        load_settings(None, {"no_such_knob": 1})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("http_port = 'eighty'\n", "http_port"),
        ("http_port = 70000\n", "http_port"),
        ("[store]\nflush = 'sometimes'\n", "flush"),
        ("log_level = 'loud'\n", "log_level"),
        ("[[topics]]\nqueues = 2\n", "name"),
        ("[[topics]]\nname = 'a'\ntype = 'PRIORITY'\n", "type"),
        ("[[topics]]\nname = 'a'\n[[topics]]\nname = 'a'\n", "twice"),
        ("http_port = \n", "not valid TOML"),
    ],
)
def test_bad_values_are_clear_errors(tmp_path: Path, text: str, needle: str) -> None:
    cfg = _write(tmp_path / "bad.toml", text)
    with pytest.raises(ValueError) as info:
        load_settings(cfg, {})
    assert needle in str(info.value)


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", {})


# -- the command line -----------------------------------------------------------------


def _cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_unimq_command(), *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_up_help_lists_the_contract_flags() -> None:
    result = _cli("up", "--help")
    assert result.returncode == 0, result.stderr
    for flag in (
        "--data-dir",
        "--host",
        "--mqtt-port",
        "--amqp-port",
        "--http-port",
        "--grpc-port",
        "--namesrv-port",
        "--flush",
        "--config",
    ):
        assert flag in result.stdout


def test_up_with_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    cfg = _write(tmp_path / "bad.toml", "[store]\nflsh = 'sync'\n")
    result = _cli("up", "--config", str(cfg), "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2
    assert "'flsh'" in result.stderr and "did you mean 'flush'" in result.stderr


def test_main_is_importable_in_process() -> None:
    from unimq.cli import main

    with pytest.raises(SystemExit) as info:
        main(["up", "--http-port", "99999"])
    assert info.value.code == 2


# -- a real server ----------------------------------------------------------------------


@needs_store
def test_up_serves_healthz_and_stops_cleanly_on_sigterm(unimq_server) -> None:
    server: UnimqProcess = unimq_server()
    assert server.stdout_lines[-1] == "unimq: ready"
    assert "http" in server.ports and server.ports["http"] > 0
    assert f"unimq: http listening on 127.0.0.1:{server.ports['http']}" in server.stdout_lines

    status, body = _get(server.url("http", "/healthz"))
    assert (status, body) == (200, {"status": "ok"})

    marker = _abort_marker(server.data_dir)
    assert marker.exists(), "a running store keeps its abort marker"

    assert server.stop(signal.SIGTERM) == 0, server.stderr()
    assert not marker.exists(), "a clean stop removes the abort marker"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=2).close()


@needs_store
def test_sigint_stops_cleanly_and_restart_reuses_the_data_dir(unimq_server) -> None:
    first: UnimqProcess = unimq_server()
    marker = _abort_marker(first.data_dir)
    assert first.stop(signal.SIGINT) == 0, first.stderr()
    assert not marker.exists()

    second: UnimqProcess = unimq_server(data_dir=first.data_dir)
    assert _get(second.url("http", "/healthz"))[0] == 200
    assert second.stop() == 0, second.stderr()
    assert not marker.exists()


@needs_store
def test_up_reads_the_config_file_and_flags_win(unimq_server, tmp_path: Path, free_port) -> None:
    port = free_port()
    cfg = _write(
        tmp_path / "unimq.toml",
        f"""
http_port = {port}
log_level = "warning"

[store]
flush = "sync"
commitlog_segment_size = 1048576

[[topics]]
name = "orders"
queues = 2
type = "FIFO"
""",
    )
    # The fixture passes --http-port 0 before our args; ours come later and win.
    server: UnimqProcess = unimq_server("--config", str(cfg), "--http-port", str(port))
    assert server.ports["http"] == port
    assert _get(server.url("http", "/healthz")) == (200, {"status": "ok"})
    assert server.stop() == 0, server.stderr()


@needs_store
def test_port_in_use_fails_with_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _cli(
            "up",
            "--data-dir",
            str(tmp_path / "d"),
            "--http-port",
            str(port),
            *[a for flag in ("--mqtt-port", "--amqp-port", "--grpc-port", "--namesrv-port") for a in (flag, "0")],
        )
    assert result.returncode == 1
    assert "unimq: error:" in result.stderr and "in use" in result.stderr
    assert not _abort_marker(tmp_path / "d").exists(), "a failed start still shuts the store down cleanly"


def test_python_dash_m_unimq_works() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "unimq", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "up" in result.stdout


# -- in process ---------------------------------------------------------------------------


async def test_healthz_is_503_until_ready_and_again_when_stopping() -> None:
    import httpx

    from adapters.cloudevents.http_app import create_app
    from gateway.door import ServerState

    state = ServerState(settings=UnimqSettings())
    transport = httpx.ASGITransport(app=create_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://unimq") as client:
        resp = await client.get("/healthz")
        assert (resp.status_code, resp.json()) == (503, {"status": "starting"})
        state.phase = "ready"
        resp = await client.get("/healthz")
        assert (resp.status_code, resp.json()) == (200, {"status": "ok"})
        state.phase = "stopping"
        assert (await client.get("/healthz")).status_code == 503


@needs_store
async def test_run_in_process_with_ready_and_stop_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    import httpx

    from unimq.process import run

    overrides = {f"{door}_port": 0 for door in ("mqtt", "amqp", "http", "grpc", "namesrv")}
    settings = load_settings(None, {**overrides, "data_dir": tmp_path / "d", "flush": "sync"})
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run(settings, ready_event=ready, stop_event=stop))
    await asyncio.wait_for(ready.wait(), timeout=60)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "unimq: ready"
    port = int(next(line for line in out if line.startswith("unimq: http listening on ")).rsplit(":", 1)[1])
    async with httpx.AsyncClient() as client:
        resp = await client.get(f"http://127.0.0.1:{port}/healthz")
    assert (resp.status_code, resp.json()) == (200, {"status": "ok"})
    marker = _abort_marker(tmp_path / "d")
    assert marker.exists()
    stop.set()
    await asyncio.wait_for(task, timeout=60)
    assert not marker.exists()


# -- listeners: a flag each, port 0 everywhere, a taken port named ----------------------

#: Every listener `unimq up` can open, with its flag (the setting of the same name, dashes as underscores).
LISTENER_FLAGS = (
    "--namesrv-port", "--broker-port", "--http-port", "--grpc-port",
    "--mqtt-port", "--mqtt-ws-port", "--mqtt-tls-port", "--amqp-port",
)
#: The ports unimq listens on when not told otherwise.
DEFAULT_PORTS = {9876, 8080, 8081, 1883, 8083, 8883, 5672, 8090}


def test_up_help_shows_a_flag_for_every_listener_and_set() -> None:
    result = _cli("up", "--help")
    assert result.returncode == 0, result.stderr
    for flag in (*LISTENER_FLAGS, "--set", "--mqtt-tls-cert", "--grpc-tls-cert", "--log-level"):
        assert flag in result.stdout, flag
    for flag in LISTENER_FLAGS:  # and each is the config key of the same name
        assert flag.removeprefix("--").replace("-", "_") in {f.name for f in dataclasses.fields(UnimqSettings)}


@needs_store
def test_two_servers_side_by_side_on_port_0_share_no_port(unimq_server, tmp_path: Path) -> None:
    """Port 0 for every listener (MQTT over TLS included): a second unimq starts beside the first."""
    from tls_helpers import self_signed

    cert, key = self_signed(tmp_path)
    zeros = [a for flag in LISTENER_FLAGS for a in (flag, "0")]
    tls = ["--mqtt-tls-cert", str(cert), "--mqtt-tls-key", str(key)]
    first: UnimqProcess = unimq_server(*zeros, *tls)
    second: UnimqProcess = unimq_server(*zeros, *tls)
    names = {"namesrv", "broker", "http", "grpc", "mqtt", "mqttws", "mqtts", "amqp"}
    assert set(first.ports) == set(second.ports) == names
    assert not set(first.ports.values()) & set(second.ports.values())
    assert not (set(first.ports.values()) | set(second.ports.values())) & DEFAULT_PORTS
    for server in (first, second):
        assert _get(server.url("http", "/healthz")) == (200, {"status": "ok"})
        assert server.stop() == 0, server.stderr()


@needs_store
@pytest.mark.parametrize("flag, what", [
    ("--mqtt-ws-port", "MQTT over WebSocket door"),
    ("--broker-port", "broker RPC listener"),
    ("--grpc-port", "gRPC door"),  # grpcio reports a failed bind without an errno
])
def test_a_taken_port_stops_start_up_naming_the_door_and_port(tmp_path: Path, flag: str, what: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = [a for f in LISTENER_FLAGS for a in (f, str(port) if f == flag else "0")]
        result = _cli("up", "--data-dir", str(tmp_path / "d"), "--set", "store.commitlog_segment_size=67108864",
                      *ports)
    assert result.returncode == 1, result.stderr
    assert f"unimq: error: cannot start the {what}: 127.0.0.1:{port} is already in use" in result.stderr.splitlines()
    assert not _abort_marker(tmp_path / "d").exists(), "a failed start still shuts the store down cleanly"


@needs_store
def test_start_up_names_each_listener_once(unimq_server) -> None:
    """One `unimq:` line per listener and no log line repeating it; the internal listeners say who they are for."""
    server: UnimqProcess = unimq_server("--log-level", "info")
    listening = [line for line in server.stdout_lines if " listening on " in line]
    assert len(listening) == len(server.ports) == len({line.split()[1] for line in listening})
    namesrv = f"127.0.0.1:{server.ports['namesrv']}"
    assert f"unimq: namesrv and broker are for extra gateways: unimq gateway --namesrv {namesrv}" in server.stdout_lines
    assert server.stop() == 0
    err = server.stderr()
    for name, port in server.ports.items():
        if name != "broker":  # the nameserver logs the broker registering, which names its address
            assert f":{port}" not in err, (name, err)
    assert "listening" not in err and "door on" not in err, err
