"""The HTTP door's push subscription routes (CloudEvents Subscriptions API style).

Why thin: the deliveries themselves (retries with backoff, the group's DLQ,
in-flight limits) are ``push.py``'s :class:`PushManager`; these routes create,
list, show and delete its subscriptions, each after checking that the process
is ready. A subscription notes who created it (``owner``): a user's push
subscriptions count against its ``subscriptions`` limit (``gateway.access.traffic``;
429 beyond it), as an MQTT connection's subscriptions do.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.access.model import ANONYMOUS
from gateway.access.traffic import QuotaExceededError, TrafficControl
from gateway.auth import Action, Resource

from .http_models import ERRORS, SubscriptionIn
from .http_request import Deps, request_context
from .http_responses import json_response
from .push import PushManager

__all__ = ["router"]


def router(deps: Deps, push: PushManager) -> APIRouter:
    """``/v1/subscriptions``: webhooks fed from a topic by ``push``.

    A subscription consumes its topic as its group on the caller's behalf, so the caller
    needs consume on both to create, see or delete one (the list shows only those)."""
    processor = deps.processor
    router = APIRouter()

    def may_consume(request: Request, topic: str, group: str, *, raise_: bool = True) -> bool:
        p = processor()
        ctx = request_context(request, "http")
        if not raise_:
            return p.allowed(ctx, Action.SUBSCRIBE, Resource.TOPIC, topic) and \
                p.allowed(ctx, Action.SUBSCRIBE, Resource.GROUP, group)
        p.authorize(ctx, Action.SUBSCRIBE, Resource.TOPIC, topic)
        p.authorize(ctx, Action.SUBSCRIBE, Resource.GROUP, group)
        return True

    # -- push subscriptions -------------------------------------------------------------------

    @router.post("/v1/subscriptions", tags=["push"], status_code=201, responses=ERRORS)
    async def create_subscription(body: SubscriptionIn, request: Request) -> Response:
        """Push a topic's events to a webhook: at-least-once, retries with backoff, then the group's DLQ."""
        may_consume(request, body.topic, body.group or "push-")
        ctx = request_context(request, "http")
        ids = deps.state.identities
        if ids is not None and ids.traffic.active and not ctx.trusted:
            within_limit(ids.traffic, ctx.principal)
        return json_response(await push.create(body.model_dump(), owner=ctx.principal), 201)

    def within_limit(traffic: TrafficControl, principal: str | None) -> None:
        """QuotaExceededError (429) when the caller has as many push subscriptions as its limit allows."""
        most = traffic.meter(principal).subscriptions()
        if most is None:
            return
        name = principal if principal is not None else ANONYMOUS
        have = sum(1 for s in push.list() if s.get("owner", ANONYMOUS) == name)
        if have >= most:
            processor().metrics.inc("quota_exceeded", "http")
            raise QuotaExceededError(f"user '{name}' has reached its subscription limit ({most})",
                                     what="subscriptions", subject=f"user:{name}", limit=most, retry_after_s=60.0)

    @router.get("/v1/subscriptions", tags=["push"])
    async def list_subscriptions(request: Request) -> Response:
        processor()
        return json_response([s for s in push.list() if may_consume(request, s["topic"], s["group"], raise_=False)])

    @router.get("/v1/subscriptions/{sid}", tags=["push"], responses=ERRORS)
    async def get_subscription(sid: str, request: Request) -> Response:
        sub = push.get(sid)
        may_consume(request, sub["topic"], sub["group"])
        return json_response(sub)

    @router.delete("/v1/subscriptions/{sid}", tags=["push"], status_code=204, response_class=Response, responses=ERRORS)
    async def delete_subscription(sid: str, request: Request) -> Response:
        sub = push.get(sid)
        may_consume(request, sub["topic"], sub["group"])
        await push.delete(sid)
        return Response(status_code=204)

    return router
