"""`unimq demo`: three kinds of producers write into a running unimq for a bounded time.

    unimq up &                       # in another terminal
    unimq demo --seconds 30          # then analyse with Spark (README, "Spark")

- simulated **MQTT devices** (paho-mqtt, MQTT 5, QoS 1) publish telemetry to
  ``factory/<line>/<device>/telemetry`` -> unified topic ``factory``;
- a **CloudEvents source** posts building events over HTTP (binary mode) to
  topic ``events``;
- an **AMQP application** (pika, publisher confirms) publishes orders to the
  topic exchange ``orders`` -> topic ``orders``.

Every body is JSON with numeric fields (``temp``, ``humidity``, ``duration_s``,
``amount``, ``qty`` ...) so the stats job has something to aggregate. Real
client libraries are used on purpose: the point is to show what foreign
producers store, not what unimq's own code would. A progress line shows what
each producer sent; at the end the topics' sizes and the Spark command to run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

TOPICS = {"factory": "mqtt", "events": "cloudevents", "orders": "amqp"}


@dataclass
class Counters:
    sent: dict[str, int] = field(default_factory=lambda: {p: 0 for p in TOPICS.values()})
    errors: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, proto: str, n: int = 1) -> None:
        with self.lock:
            self.sent[proto] += n

    def fail(self, proto: str, err: BaseException) -> None:
        with self.lock:
            self.errors[proto] = f"{type(err).__name__}: {err}"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "demo",
        help="simulate MQTT devices, a CloudEvents source and an AMQP app against a running unimq",
        description=(__doc__ or "").split("\n\n")[0] + " Needs `unimq up` running and the spark extra "
        "(pip install 'unimq[spark]': paho-mqtt, pika).",
    )
    p.add_argument("--host", default="127.0.0.1", help="where unimq runs (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, default=8080, help="HTTP door (default 8080)")
    p.add_argument("--mqtt-port", type=int, default=1883, help="MQTT door (default 1883)")
    p.add_argument("--amqp-port", type=int, default=5672, help="AMQP door (default 5672)")
    p.add_argument("--amqp-user", default="guest")
    p.add_argument("--amqp-password", default="guest")
    p.add_argument("--seconds", type=float, default=30.0, help="how long to produce (default 30)")
    p.add_argument("--devices", type=int, default=6, help="simulated MQTT devices (default 6)")
    p.add_argument("--rate", type=float, default=10.0,
                   help="messages per second per device, and for each of the other two producers (default 10)")
    p.add_argument("--seed", type=int, default=7)
    return p


def _pace(start: float, i: int, rate: float, stop: threading.Event) -> bool:
    """Sleep until message ``i`` is due; False when it is time to stop."""
    due = start + i / rate
    delay = due - time.monotonic()
    if delay > 0:
        return not stop.wait(delay)
    return not stop.is_set()


def mqtt_device(args: argparse.Namespace, n: int, counters: Counters, stop: threading.Event) -> None:
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    rnd = random.Random(args.seed * 1000 + n)
    dev = f"dev-{n:02d}"
    line = f"line-{n % 2 + 1}"
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"unimq-demo-{dev}", protocol=mqtt.MQTTv5)
    try:
        c.connect(args.host, args.mqtt_port, keepalive=30)
        c.loop_start()
        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = "application/json"
        props.UserProperty = [("device", dev), ("firmware", "1.4.2")]
        temp, hum = rnd.uniform(18, 24), rnd.uniform(35, 55)
        start, i = time.monotonic(), 0
        pending = []
        while _pace(start, i, args.rate, stop):
            temp += rnd.gauss(0, 0.3)
            hum = min(100.0, max(0.0, hum + rnd.gauss(0, 0.5)))
            body = {"device": dev, "line": line, "temp": round(temp, 2), "humidity": round(hum, 1),
                    "vibration": round(abs(rnd.gauss(0.2, 0.1)), 3)}
            pending.append(c.publish(f"factory/{line}/{dev}/telemetry", json.dumps(body), qos=1, properties=props))
            i += 1
            while pending and pending[0].is_published():
                pending.pop(0)
                counters.add("mqtt")
        for info in pending:
            info.wait_for_publish(10)
            counters.add("mqtt")
    except Exception as e:  # shown in the progress line; the other producers go on
        counters.fail("mqtt", e)
    finally:
        c.loop_stop()
        c.disconnect()


def cloudevents_source(args: argparse.Namespace, counters: Counters, stop: threading.Event) -> None:
    rnd = random.Random(args.seed)
    conn = http.client.HTTPConnection(args.host, args.http_port, timeout=30)
    kinds = [("com.example.door.opened", "duration_s"), ("com.example.badge.scanned", "floor"),
             ("com.example.hvac.reading", "co2_ppm")]
    try:
        start, i = time.monotonic(), 0
        while _pace(start, i, args.rate, stop):
            typ, key = rnd.choice(kinds)
            value = {"duration_s": round(rnd.expovariate(1 / 8), 2), "floor": rnd.randint(0, 6),
                     "co2_ppm": rnd.randint(400, 1400)}[key]
            headers = {"ce-specversion": "1.0", "ce-id": f"demo-{i}", "ce-source": "/building/7",
                       "ce-type": typ, "ce-subject": f"door-{rnd.randint(1, 12)}",
                       "ce-time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "content-type": "application/json"}
            conn.request("POST", "/v1/topics/events/events", json.dumps({key: value}), headers)
            r = conn.getresponse()
            r.read()
            if r.status >= 300:
                raise RuntimeError(f"HTTP {r.status} from the CloudEvents endpoint")
            counters.add("cloudevents")
            i += 1
    except Exception as e:
        counters.fail("cloudevents", e)
    finally:
        conn.close()


def amqp_app(args: argparse.Namespace, counters: Counters, stop: threading.Event) -> None:
    import pika

    rnd = random.Random(args.seed + 1)
    creds = pika.PlainCredentials(args.amqp_user, args.amqp_password)
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters(args.host, args.amqp_port, "/", creds))
    except Exception as e:
        counters.fail("amqp", e)
        return
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("orders", exchange_type="topic", durable=True)
        start, i = time.monotonic(), 0
        while _pace(start, i, args.rate, stop):
            region = rnd.choice(["eu", "us", "apac"])
            qty = rnd.randint(1, 5)
            order = {"order_id": f"o-{i:06d}", "region": region, "qty": qty,
                     "amount": round(qty * rnd.uniform(4, 60), 2), "currency": "EUR"}
            ch.basic_publish("orders", f"order.created.{region}", json.dumps(order).encode(),
                             pika.BasicProperties(content_type="application/json", delivery_mode=2,
                                                  message_id=order["order_id"], app_id="shop",
                                                  headers={"region": region}))
            counters.add("amqp")
            i += 1
    except Exception as e:
        counters.fail("amqp", e)
    finally:
        try:
            conn.close()
        except Exception:
            pass


def _topic_sizes(host: str, port: int) -> dict[str, int]:
    out = {}
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        for t in TOPICS:
            conn.request("GET", f"/v1/topics/{urllib.parse.quote(t, safe='')}")
            r = conn.getresponse()
            data = r.read()
            if r.status == 200:
                out[t] = sum(q["max_offset"] - q["min_offset"] for q in json.loads(data)["queues"])
    finally:
        conn.close()
    return out


def run(args: argparse.Namespace) -> int:
    try:
        import paho.mqtt.client  # noqa: F401
        import pika  # noqa: F401
    except ImportError as e:
        print(f"unimq demo: {e.name} is missing: pip install 'unimq[spark]'", file=sys.stderr)
        return 2
    endpoint = f"http://{args.host}:{args.http_port}"
    try:
        conn = http.client.HTTPConnection(args.host, args.http_port, timeout=10)
        for t in TOPICS:  # 4 queues each, so Spark reads them with some parallelism
            conn.request("POST", "/v1/topics", json.dumps({"name": t, "queues": 4}),
                         {"content-type": "application/json"})
            conn.getresponse().read()
        conn.close()
    except OSError as e:
        print(f"unimq demo: no unimq HTTP door at {endpoint} ({e}); start one with `unimq up`", file=sys.stderr)
        return 1
    counters = Counters()
    stop = threading.Event()
    threads = [threading.Thread(target=mqtt_device, args=(args, n, counters, stop), daemon=True)
               for n in range(args.devices)]
    threads.append(threading.Thread(target=cloudevents_source, args=(args, counters, stop), daemon=True))
    threads.append(threading.Thread(target=amqp_app, args=(args, counters, stop), daemon=True))
    print(f"unimq demo: {args.devices} MQTT devices -> topic factory, a CloudEvents source -> topic events, "
          f"an AMQP shop -> topic orders, for {args.seconds:g}s (Ctrl-C stops early)", flush=True)
    t0 = time.monotonic()
    for t in threads:
        t.start()
    tty = sys.stdout.isatty()
    last_line = 0.0
    try:
        while time.monotonic() - t0 < args.seconds and any(t.is_alive() for t in threads):
            time.sleep(0.5)
            now = time.monotonic()
            if tty or now - last_line >= 5:
                last_line = now
                s = counters.sent
                line = (f"[demo {now - t0:4.0f}/{args.seconds:g}s] mqtt {s['mqtt']:,} · cloudevents "
                        f"{s['cloudevents']:,} · amqp {s['amqp']:,}"
                        + (f" · errors: {', '.join(counters.errors)}" if counters.errors else ""))
                print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
    except KeyboardInterrupt:
        pass
    stop.set()
    for t in threads:
        t.join(timeout=15)
    if tty:
        print()
    s = counters.sent
    print(f"unimq demo: sent mqtt {s['mqtt']:,}, cloudevents {s['cloudevents']:,}, amqp {s['amqp']:,} messages")
    for proto, err in counters.errors.items():
        print(f"unimq demo: the {proto} producer stopped: {err}", file=sys.stderr)
    sizes = _topic_sizes(args.host, args.http_port)
    print("unimq demo: stored " + ", ".join(f"{t} {n:,}" for t, n in sizes.items()))
    print("Analyse all three with Spark (README, Spark):\n"
          f"  python -m spark_ingest.jobs.stats --endpoint {endpoint} --topics factory,events,orders "
          "--available-now")
    return 1 if counters.errors else 0
