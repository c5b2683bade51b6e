"""A small HTTP client for the gateway's HTTP door, used by the driver and the executors.

Why stdlib ``http.client`` with one keep-alive connection rather than httpx or
requests: executors create a client inside ``read()`` (a socket cannot be
pickled with the reader, see the connector notes' pitfall 4), each task makes a
few hundred sequential requests to one host, and nothing else is needed; it
adds no import cost or dependency to Spark's Python workers.
"""

from __future__ import annotations

import http.client
import time
import urllib.parse
from typing import Any

import orjson

from . import wire

ARROW = wire.MEDIA_TYPE


#: The HTTP door's batch of plain messages (part of its network API, as the paths are).
BATCH_JSON = "application/vnd.unimq.batch+json"


class GatewayError(RuntimeError):
    """An HTTP error answer of the door: ``{"error": CODE, "message": text}``."""

    def __init__(self, status: int, code: str, message: str, url: str = "") -> None:
        super().__init__(f"HTTP {status} {code}: {message}" + (f" ({url})" if url else ""))
        self.status = status
        self.code = code


class GatewayClient:
    def __init__(self, endpoint: str, timeout_s: float = 60.0, retries: int = 3) -> None:
        u = urllib.parse.urlsplit(endpoint)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"endpoint must be an http(s) URL, got {endpoint!r}")
        self.endpoint = endpoint
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.base = u.path.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self._conn: http.client.HTTPConnection | None = None

    def __getstate__(self) -> dict:  # never ship a live socket to an executor
        d = dict(self.__dict__)
        d["_conn"] = None
        return d

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout_s)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "GatewayClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request with retries on connection errors and 5xx; raises GatewayError on 4xx/5xx."""
        url = self.base + path
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt > 1:  # the first retry is immediate: usually a keep-alive the server closed
                time.sleep(min(0.25 * 2 ** (attempt - 2), 4.0))
            conn = self._connection()
            try:
                conn.request(method, url, body=body, headers=headers or {})
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as e:  # reset, refused, timeout, half-closed keep-alive
                self.close()
                last = e
                continue
            if resp.status >= 400:
                try:
                    err = orjson.loads(data)
                    code, msg = str(err.get("error", resp.status)), str(err.get("message", ""))
                except Exception:
                    code, msg = str(resp.status), data[:200].decode(errors="replace")
                last = GatewayError(resp.status, code, msg, f"{method} {self.endpoint}{path}")
                if resp.status >= 500 and method == "GET":
                    continue
                raise last
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        if isinstance(last, GatewayError):
            raise last
        raise ConnectionError(f"unimq HTTP door {self.endpoint} unreachable after {self.retries + 1} tries: {last}")

    def get_json(self, path: str) -> Any:
        return orjson.loads(self.request("GET", path)[2])

    # -- the calls the connector makes

    @staticmethod
    def _t(topic: str) -> str:
        return urllib.parse.quote(topic, safe="")

    def list_topics(self) -> dict[str, dict[int, tuple[int, int]]]:
        """{topic: {queue id: (min offset, max offset)}} of every user topic."""
        out: dict[str, dict[int, tuple[int, int]]] = {}
        for t in self.get_json("/v1/topics"):
            out[t["name"]] = {int(q["queue_id"]): (int(q["min_offset"]), int(q["max_offset"])) for q in t["queues"]}
        return out

    def describe(self, topic: str) -> dict[int, tuple[int, int]] | None:
        """{queue id: (min offset, max offset)} of one topic; None if it does not exist."""
        try:
            r = self.get_json(f"/v1/topics/{self._t(topic)}")
        except GatewayError as e:
            if e.status == 404:
                return None
            raise
        return {int(q["queue_id"]): (int(q["min_offset"]), int(q["max_offset"])) for q in r["queues"]}

    def pull_json(self, topic: str, queue_id: int, offset: int, max_count: int) -> dict:
        return self.get_json(f"/v1/topics/{self._t(topic)}/queues/{queue_id}/messages?offset={offset}&max={max_count}")

    def pull_arrow(self, topic: str, queue_id: int, offset: int, max_count: int) -> tuple[list, int, int, int]:
        """(record batches, next offset, queue min offset, queue max offset) of one Arrow page."""
        _, headers, data = self.request(
            "GET", f"/v1/topics/{self._t(topic)}/queues/{queue_id}/messages?offset={offset}&max={max_count}&format=arrow",
            headers={"accept": ARROW})
        if not headers.get("content-type", "").startswith(ARROW):
            raise GatewayError(406, "NOT_ACCEPTABLE", "the door answered JSON to format=arrow (an older unimq)")
        return (wire.from_ipc(data), int(headers["unimq-next-offset"]), int(headers["unimq-min-offset"]),
                int(headers["unimq-max-offset"]))

    def send(self, topic: str, body: bytes, headers: dict[str, str]) -> dict:
        """A plain message (``POST /v1/topics/{topic}/messages``); properties as unimq-prop-* headers."""
        return orjson.loads(self.request("POST", f"/v1/topics/{self._t(topic)}/messages", body=body, headers=headers)[2])

    def send_batch(self, topic: str, items: list[dict]) -> list:
        """Several plain messages in one request (``application/vnd.unimq.batch+json``): one record
        on a batch topic. ``items``: ``{"body_base64", "tag", "keys", "properties"}``."""
        return orjson.loads(self.request("POST", f"/v1/topics/{self._t(topic)}/messages", body=orjson.dumps(items),
                                         headers={"content-type": BATCH_JSON})[2])

    def create_topic(self, topic: str, queues: int = 4, kind: str = "NORMAL") -> None:
        """Create ``topic`` of type ``kind``; nothing if it exists with that type (409: another type)."""
        self.request("POST", "/v1/topics", body=orjson.dumps({"name": topic, "queues": queues, "type": kind}),
                     headers={"content-type": "application/json"})

    def delete_topic(self, topic: str) -> bool:
        """Delete ``topic`` with its messages; False if there was none."""
        try:
            self.request("DELETE", f"/v1/topics/{self._t(topic)}")
        except GatewayError as e:
            if e.status == 404:
                return False
            raise
        return True

    def read_table(self, topic: str, page: int = 4096) -> list[dict]:
        """Every row of a COMPACTED topic's table (``GET /v1/topics/{t}/table``, page by page): the
        latest message of each key (``key``, ``body_base64``, ...), deleted keys left out."""
        rows: list[dict] = []
        cursor: str | None = None
        while True:
            q = f"?max={page}" + (f"&cursor={urllib.parse.quote(cursor, safe='')}" if cursor else "")
            doc = self.get_json(f"/v1/topics/{self._t(topic)}/table{q}")
            rows += doc["rows"]
            cursor = doc["cursor"]
            if cursor is None:
                return rows
