"""GET /v1/topics/{t}/messages: a whole topic, every queue merged, paged by a cursor (issue 14:
"did my message arrive?" - reading back by queue showed one of eight queues)."""

from __future__ import annotations

import httpx
import pytest


@pytest.mark.timeout(120)
def test_read_a_topic_across_its_queues(unimq_server) -> None:  # type: ignore[no-untyped-def]
    srv = unimq_server()
    with httpx.Client(base_url=srv.url("http"), timeout=20) as http:
        assert http.post("/v1/topics", json={"name": "spread", "queues": 8}).status_code in (200, 201)
        sent = [f"m{i:03d}".encode() for i in range(50)]
        for b in sent:  # the producer spreads them over the 8 queues
            assert http.post("/v1/topics/spread/messages", content=b).status_code == 200
        got: list[bytes] = []
        cursor = None
        pages = 0
        while True:
            params = {"max": 16} | ({"cursor": cursor} if cursor else {})
            r = http.get("/v1/topics/spread/messages", params=params)
            assert r.status_code == 200, r.text
            page = r.json()
            import base64

            got += [base64.b64decode(m["body_base64"]) for m in page["messages"]]
            cursor = page["cursor"]
            pages += 1
            if page["remaining"] == 0:
                break
            assert pages < 10
        assert sorted(got) == sorted(sent) and len(got) == 50
        assert len({m for m in got}) == 50
        assert pages == 4  # 16 + 16 + 16 + 2
        # read again from the start: the same; a later page moves nothing (a look, not a consumer)
        again = http.get("/v1/topics/spread/messages", params={"max": 100}).json()
        assert len(again["messages"]) == 50 and again["remaining"] == 0
        assert http.get("/v1/topics/spread/messages", params={"cursor": "%%%"}).status_code == 400
        assert http.get("/v1/topics/nosuch/messages").status_code == 404
        # the queue route still wins for its own paths
        assert "next_offset" in http.get("/v1/topics/spread/queues/0/messages").json()
