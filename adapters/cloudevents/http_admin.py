"""The HTTP door's admin API for users, permissions and limits: ``/v1/admin/users``, ``/acl``, ``/quotas``, imports.

Why on the HTTP door: it is the admin surface of every deployment shape (the
``unimq user`` and ``unimq acl`` commands are its clients, like ``unimq
topic``). Every route asks the processor's authorizer for ``admin`` on the
admin area it touches (``users``, ``acl`` or ``quotas``; a superuser has it), so the check
is the one every door's calls go through. Changes go to the identity store
(``gateway.access.store``), which every gateway picks up within a second.
Passwords arrive in request bodies (never in URLs, which end up in logs) and
never leave: answers show users without hashes; a new API key is shown once.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.responses import Response

from core_broker.errors import InvalidArgumentError
from gateway.access.imports import Imported, mosquitto, rabbitmq_definitions
from gateway.access.limits import Limits, parse_subject
from gateway.access.model import Permission, parse_actions
from gateway.access.store import IdentityStore
from gateway.auth import Action, Resource

from .http_errors import ApiError, install_error_handlers
from .http_models import ERRORS
from .http_request import Deps, read_body, request_context
from .http_responses import json_response

__all__ = ["admin_app", "router"]

_MAX_BODY = 16 * 1024 * 1024


def admin_app(deps: Deps) -> FastAPI:
    """The admin API as its own app, mounted at ``/v1/admin`` with its own document
    (``/v1/admin/openapi.json``, ``/v1/admin/docs``): the messaging API's document stays what
    client developers need."""
    app = FastAPI(title="unimq admin", version="1", openapi_url="/openapi.json", docs_url="/docs", redoc_url=None,
                  description="Users, API keys and permissions of unimq (needs `admin`).")
    install_error_handlers(app)
    app.include_router(router(deps))
    return app


def router(deps: Deps) -> APIRouter:
    router = APIRouter(tags=["admin"], responses=ERRORS)

    async def store_for(request: Request, area: str) -> IdentityStore:
        """The identity store, once the caller is known to hold ``admin`` on ``area`` (401/403 else)."""
        p = deps.processor()
        p.authorize(request_context(request, "http"), Action.ADMIN, Resource.CLUSTER, area)
        store = deps.state.identities
        if store is None:
            raise ApiError(503, "SERVICE_UNAVAILABLE", "users and permissions are not loaded")
        return store

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await read_body(request, _MAX_BODY))
        except ValueError:
            raise ApiError(400, "BAD_REQUEST", "the body must be JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "BAD_REQUEST", "the body must be a JSON object")
        return body

    def text(body: dict[str, Any], key: str, default: str | None = None) -> str:
        v = body.get(key, default)
        if not isinstance(v, str):
            raise ApiError(400, "BAD_REQUEST", f"{key!r} must be a string")
        return v

    def roles_of(body: dict[str, Any]) -> list[str]:
        roles = body.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ApiError(400, "BAD_REQUEST", "'roles' must be a list of strings")
        return roles

    @router.get("/users")
    async def list_users(request: Request) -> Response:
        """Every user (names, roles, API key ids; never a hash)."""
        store = await store_for(request, "users")
        return json_response([u.public() for _, u in sorted(store.snapshot.users.items())])

    @router.post("/users", status_code=201)
    async def add_user(request: Request) -> Response:
        """Add a user: `{"name", "password", "roles": [], "admin": false}`; 409 if the name is taken."""
        store = await store_for(request, "users")
        body = await body_of(request)
        name, password = text(body, "name"), text(body, "password", "")
        user = await store.add_user(name, password or None, roles_of(body))
        if body.get("admin") is True:
            await store.grant(Permission(name, "admin", "*", frozenset({"admin"})))
        return json_response(user.public(), 201)

    @router.get("/users/{name}")
    async def get_user(request: Request, name: str = Path()) -> Response:
        store = await store_for(request, "users")
        return json_response(store.user(name).public())

    @router.put("/users/{name}/password", status_code=204, response_class=Response)
    async def set_password(request: Request, name: str = Path()) -> Response:
        """Change a user's password: `{"password": "..."}` (open connections keep going; new logins need it)."""
        store = await store_for(request, "users")
        await store.set_password(name, text(await body_of(request), "password"))
        return Response(status_code=204)

    @router.put("/users/{name}/roles", status_code=204, response_class=Response)
    async def set_roles(request: Request, name: str = Path()) -> Response:
        store = await store_for(request, "users")
        await store.set_roles(name, roles_of(await body_of(request)))
        return Response(status_code=204)

    @router.delete("/users/{name}", status_code=204, response_class=Response)
    async def delete_user(request: Request, name: str = Path()) -> Response:
        """Delete a user and the permissions granted to them by name."""
        store = await store_for(request, "users")
        await store.delete_user(name)
        return Response(status_code=204)

    @router.post("/users/{name}/keys", status_code=201)
    async def add_key(request: Request, name: str = Path()) -> Response:
        """A new API key for the user: `{"key": "umk_...", "key_id"}`; the key is shown only this once."""
        store = await store_for(request, "users")
        token, key = await store.add_api_key(name)
        return json_response({"key": token, "key_id": key.key_id, "user": name}, 201)

    @router.delete("/users/{name}/keys/{key_id}", status_code=204, response_class=Response)
    async def delete_key(request: Request, name: str = Path(), key_id: str = Path()) -> Response:
        store = await store_for(request, "users")
        if not await store.delete_api_key(name, key_id):
            raise ApiError(404, "KEY_NOT_FOUND", f"user {name!r} has no API key {key_id!r}")
        return Response(status_code=204)

    @router.post("/users/{name}/access-keys", status_code=201)
    async def add_access_key(request: Request, name: str = Path()) -> Response:
        """A RocketMQ access key pair for the gRPC door's signature: `{"access_key", "secret_key"}` (shown once)."""
        store = await store_for(request, "users")
        key = await store.add_access_key(name)
        return json_response({"access_key": key.access_key, "secret_key": key.secret_key, "user": name}, 201)

    @router.delete("/users/{name}/access-keys/{access_key}", status_code=204, response_class=Response)
    async def delete_access_key(request: Request, name: str = Path(), access_key: str = Path()) -> Response:
        store = await store_for(request, "users")
        if not await store.delete_access_key(name, access_key):
            raise ApiError(404, "KEY_NOT_FOUND", f"user {name!r} has no access key {access_key!r}")
        return Response(status_code=204)

    @router.get("/acl")
    async def list_acl(request: Request, subject: str | None = Query(None)) -> Response:
        """Every permission (or a subject's): `{"subject", "resource", "pattern", "actions"}`."""
        store = await store_for(request, "acl")
        perms = [p.to_dict() for p in store.snapshot.permissions.values() if subject is None or p.subject == subject]
        perms.sort(key=lambda d: (d["subject"], d["resource"], d["pattern"]))
        return json_response(perms)

    @router.post("/acl", status_code=201)
    async def grant(request: Request) -> Response:
        """Grant: `{"subject", "resource": topic|group|vhost|admin, "pattern", "actions": [...]}`
        (vhost: `"configure"`, `"write"`, `"read"` regular expressions instead of actions)."""
        store = await store_for(request, "acl")
        perm = Permission.from_dict(await body_of(request))
        return json_response((await store.grant(perm)).to_dict(), 201)

    @router.post("/acl/revoke", status_code=204, response_class=Response)
    async def revoke(request: Request) -> Response:
        """Revoke: `{"subject", "resource", "pattern", "actions"?}` (no actions: all of them); 404 if none."""
        store = await store_for(request, "acl")
        body = await body_of(request)
        actions = parse_actions(body["actions"]) if body.get("actions") else None
        if not await store.revoke(text(body, "subject"), text(body, "resource"), text(body, "pattern"), actions):
            raise ApiError(404, "PERMISSION_NOT_FOUND", "nothing is granted to that subject on that pattern")
        return Response(status_code=204)

    def limits_view(store: IdentityStore, kind: str, name: str, limits: Limits) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": kind, "name": name, **limits.to_dict()}
        if name != "*":
            d["open_connections"] = store.traffic.connections(kind, name)
        return d

    @router.get("/quotas")
    async def list_quotas(request: Request) -> Response:
        """Every traffic limit: `{"kind": user|client|address, "name", "connections", "connections_per_s",
        "publish_msgs_per_s", "publish_bytes_per_s", "subscriptions", "open_connections"}` (a figure left
        out: no limit)."""
        store = await store_for(request, "quotas")
        return json_response([limits_view(store, k, n, lim) for (k, n), lim in sorted(store.snapshot.limits.items())])

    @router.get("/quotas/{kind}/{name}")
    async def get_quota(request: Request, kind: str = Path(), name: str = Path()) -> Response:
        store = await store_for(request, "quotas")
        kind, name = parse_subject(kind, name)
        lim = store.snapshot.limits.get((kind, name))
        if lim is None:
            raise ApiError(404, "QUOTA_NOT_FOUND", f"no limits for {kind} {name!r}")
        return json_response(limits_view(store, kind, name, lim))

    async def _set_quota(request: Request, kind: str, name: str, merge: bool) -> Response:
        store = await store_for(request, "quotas")
        kind, name = parse_subject(kind, name)
        lim = await store.set_limits(kind, name, Limits.from_dict(await body_of(request)), merge=merge)
        return json_response(limits_view(store, kind, name, lim))

    @router.put("/quotas/{kind}/{name}")
    async def put_quota(request: Request, kind: str = Path(description="user, client or address"),
                        name: str = Path(description="a user name, a client id, an IP address, or * for every one")
                        ) -> Response:
        """Set the limits of a user, a client id or an address (those left out: no limit); open connections
        follow within a second."""
        return await _set_quota(request, kind, name, False)

    @router.patch("/quotas/{kind}/{name}")
    async def patch_quota(request: Request, kind: str = Path(), name: str = Path()) -> Response:
        """Change some limits of a user or a client id (those left out stay as they are)."""
        return await _set_quota(request, kind, name, True)

    @router.delete("/quotas/{kind}/{name}", status_code=204, response_class=Response)
    async def delete_quota(request: Request, kind: str = Path(), name: str = Path()) -> Response:
        store = await store_for(request, "quotas")
        if not await store.delete_limits(kind, name):
            raise ApiError(404, "QUOTA_NOT_FOUND", f"no limits for {kind} {name!r}")
        return Response(status_code=204)

    async def _write(store: IdentityStore, imported: Imported, replace: bool) -> Response:
        for name, (h, roles) in imported.users.items():
            await store.add_user(name, roles=roles, password_hash=h, replace=replace)
        if imported.permissions:
            await store.grant_many(imported.permissions)
        return json_response({"users": sorted(imported.users), "permissions": len(imported.permissions),
                              "skipped": imported.skipped})

    @router.post("/import/mosquitto")
    async def import_mosquitto(request: Request, replace: bool = Query(False)) -> Response:
        """Import `{"password_file": text, "acl_file": text}` (Mosquitto's formats; hashes kept)."""
        store = await store_for(request, "users")
        store_acl = await store_for(request, "acl")
        body = await body_of(request)
        imported = mosquitto(text(body, "password_file", ""), text(body, "acl_file", ""))
        _check_new(store, imported, replace)
        return await _write(store_acl, imported, replace)

    @router.post("/import/rabbitmq")
    async def import_rabbitmq(request: Request, replace: bool = Query(False)) -> Response:
        """Import a RabbitMQ definitions export's users and permissions (the body is the export's JSON)."""
        store = await store_for(request, "users")
        await store_for(request, "acl")
        imported = rabbitmq_definitions(await body_of(request))
        _check_new(store, imported, replace)
        return await _write(store, imported, replace)

    return router


def _check_new(store: IdentityStore, imported: Imported, replace: bool) -> None:
    """Refuse (409) an import that would overwrite existing users, unless ``replace``."""
    clash = sorted(set(imported.users) & set(store.snapshot.users))
    if clash and not replace:
        raise ApiError(409, "USER_EXISTS", f"users exist already: {', '.join(clash)} (import with ?replace=true)")
    if not imported.users and not imported.permissions:
        raise InvalidArgumentError("nothing to import")
