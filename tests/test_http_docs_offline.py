"""/docs works without internet: every script, style and icon the page loads comes from unimq itself
(issue 14: FastAPI's default page loads Swagger UI from a CDN and was blank offline)."""

from __future__ import annotations

import re

import httpx
import pytest


@pytest.mark.timeout(120)
def test_docs_page_and_every_asset_it_loads_come_from_the_server(unimq_server) -> None:  # type: ignore[no-untyped-def]
    srv = unimq_server()
    with httpx.Client(base_url=srv.url("http"), timeout=20) as http:
        r = http.get("/docs")
        assert r.status_code == 200 and "swagger" in r.text.lower()
        refs = re.findall(r"""(?:src|href)=["']([^"']+)["']""", r.text)
        refs += re.findall(r"""url: ?["']([^"']+)["']""", r.text)  # the OpenAPI document the page loads
        assert refs, r.text
        for ref in refs:
            assert not ref.startswith(("http://", "https://", "//")), f"/docs loads {ref} from elsewhere"
            got = http.get(ref)
            assert got.status_code == 200 and got.content, ref
        assert any(ref.endswith(".js") for ref in refs) and any(ref.endswith(".css") for ref in refs)
        assert "/openapi.json" in refs
