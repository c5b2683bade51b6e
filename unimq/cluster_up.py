"""``unimq cluster up``: a replicated unimq on one machine, for trying it out (issue 16).

Three nameservers, each with a controller node (one Raft group), ``--groups`` broker groups of
``--replicas`` members (``--min-insync-replicas`` acknowledging), and ``--gateways`` gateways (one by
default) sharing every door's usual port but AMQP's (SO_REUSEPORT, ``--reuse-port``), each a process of its own with its own port and data folder under
``--data-dir``, started with the documented commands (``unimq nameserver --controller``,
``unimq broker --group``, ``unimq gateway``). Ctrl-C (or SIGTERM) stops them all, gateway first,
nameservers last. Kill a master (its PID is printed) and watch ``unimq cluster status``.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from .local_cluster import Proc, start_proc

__all__ = ["add_parser", "run"]


def add_parser(actions: Any) -> None:
    up = actions.add_parser("up", help="start a replicated cluster on this machine (Ctrl-C stops it)",
                            description=__doc__.split("\n\n")[0] if __doc__ else None)
    up.add_argument("--data-dir", type=Path, default=Path("unimq-cluster"), help="one folder per process in here")
    up.add_argument("--groups", type=int, default=1, help="broker groups (default 1)")
    up.add_argument("--replicas", type=int, default=3, help="members per group, master included (default 3)")
    up.add_argument("--min-insync-replicas", type=int, default=2, help="members that acknowledge a put (default 2)")
    up.add_argument("--gateways", type=int, default=1,
                    help="gateway processes sharing the MQTT, HTTP and gRPC ports (SO_REUSEPORT; default 1)")
    up.add_argument("--flush", choices=["async", "sync"], default="sync")
    for door, port in (("http", 8080), ("grpc", 8081), ("mqtt", 1883), ("amqp", 5672)):
        up.add_argument(f"--{door}-port", type=int, default=port, help=f"the gateway's {door} door (default {port})")
    up.add_argument("--mqtt-ws-port", type=int, default=-1, help="MQTT over WebSocket (default off)")
    up.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for every broker, as `unimq broker --set` (repeatable)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.min_insync_replicas <= args.replicas:
        print("unimq: error: --min-insync-replicas must be between 1 and --replicas", file=sys.stderr)
        return 2
    if args.gateways < 1:
        print("unimq: error: --gateways must be at least 1", file=sys.stderr)
        return 2
    root: Path = args.data_dir
    root.mkdir(parents=True, exist_ok=True)
    secret_file = root / "controller.secret"  # the same secret after a restart of the cluster
    if not secret_file.exists():
        secret_file.write_text(secrets.token_hex(16))
    secret = secret_file.read_text().strip()
    # the internal RPC's secret (README "Securing the cluster"): every process reads it from this file
    rpc_secret = root / "cluster.secret"
    if not rpc_secret.exists():
        rpc_secret.touch(mode=0o600)
        rpc_secret.write_text(secrets.token_hex(32))
    auth = ["--cluster-secret-file", str(rpc_secret.resolve())]
    raft = [f"127.0.0.1:{_free_port()}" for _ in range(3)]
    procs: list[Proc] = []
    stopping = threading.Event()

    def stop_all(*_: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop_all)
    try:
        nameservers = _start_parallel([
            (f"nameserver-{i + 1}", ["nameserver", "--port", "0", "--controller", "--controller-port", "0",
                                     "--data-dir", str(root / f"controller-{i + 1}"), "--raft-addr", raft[i],
                                     "--peers", ",".join(raft), "--secret", secret, *auth])
            for i in range(3)
        ])
        procs += nameservers
        namesrv = ",".join(f"127.0.0.1:{p.ports['namesrv']}" for p in nameservers)
        controllers = ",".join(f"127.0.0.1:{p.ports['controller']}" for p in nameservers)
        brokers = _start_parallel([
            (f"g{g + 1}-b{m + 1}", ["broker", "--data-dir", str(root / f"g{g + 1}-b{m + 1}"), "--port", "0",
                                    "--namesrv", namesrv, "--group", f"g{g + 1}", "--broker-id", f"b{m + 1}",
                                    "--controller-addr", controllers, "--flush", args.flush,
                                    "--min-insync-replicas", str(args.min_insync_replicas), "--heartbeat-s", "2",
                                    *(f"--set={kv}" for kv in args.sets), *auth])
            for g in range(args.groups) for m in range(args.replicas)
        ])
        procs += brokers
        gateways = _start_parallel(_gateway_specs(args, namesrv, auth, controllers))
        procs += gateways
        gateway = gateways[0]
        for p in procs:
            ports = ", ".join(f"{k} {v}" for k, v in sorted(p.ports.items()))
            print(f"unimq: {p.name} (pid {p.popen.pid}): {ports}", flush=True)
        for door in ("http", "grpc", "mqtt", "amqp"):
            if door in gateway.ports:
                print(f"unimq: {door} listening on 127.0.0.1:{gateway.ports[door]}", flush=True)
        print(f"unimq: cluster status: unimq cluster status --controller {controllers} {' '.join(auth)}", flush=True)
        print("unimq: ready", flush=True)
        try:
            while not stopping.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        return 0
    except RuntimeError as e:
        print(f"unimq: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean stop short
        for p in reversed(procs):  # gateway, brokers, nameservers
            p.stop()


def _gateway_specs(args: argparse.Namespace, namesrv: str, auth: list[str],
                   controllers: str) -> list[tuple[str, list[str]]]:
    """The gateways' command lines: one alone as before; several share the MQTT, HTTP and gRPC
    ports (a port 0 asked for is picked once here: 0 itself cannot be shared) and only the first
    serves AMQP on its port (an AMQP queue lives in one process; the others pick a free one)."""
    n = args.gateways

    def shared(port: int) -> int:
        return _free_port() if n > 1 and port == 0 else port

    http, grpc, mqtt = shared(args.http_port), shared(args.grpc_port), shared(args.mqtt_port)
    ws = shared(args.mqtt_ws_port) if args.mqtt_ws_port >= 0 else -1
    specs = []
    for i in range(n):
        argv = ["gateway", "--namesrv", namesrv, "--rpc-port", "0", "--http-port", str(http), "--grpc-port",
                str(grpc), "--mqtt-port", str(mqtt), "--amqp-port", str(args.amqp_port if i == 0 else 0),
                "--mqtt-ws-port", str(ws), *auth,
                # the console's cluster page and /metrics ask these controllers for the groups
                f"--set=http_admin_controller={controllers}"]
        if n > 1:
            argv.append("--reuse-port")
        specs.append(("gateway" if n == 1 else f"gateway-{i + 1}", argv))
    return specs


def _start_parallel(specs: list[tuple[str, list[str]]]) -> list[Proc]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(specs)) as pool:
        futs = [pool.submit(start_proc, name, argv) for name, argv in specs]
        return [f.result() for f in futs]
