"""The HTTP door's push subscription routes (CloudEvents Subscriptions API style).

Why thin: the deliveries themselves (retries with backoff, the group's DLQ,
in-flight limits) are ``push.py``'s :class:`PushManager`; these routes create,
list, show and delete its subscriptions, each after checking that the process
is ready.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from .http_models import ERRORS, SubscriptionIn
from .http_request import Deps
from .http_responses import json_response
from .push import PushManager

__all__ = ["router"]


def router(deps: Deps, push: PushManager) -> APIRouter:
    """``/v1/subscriptions``: webhooks fed from a topic by ``push``."""
    processor = deps.processor
    router = APIRouter()


    # -- push subscriptions -------------------------------------------------------------------

    @router.post("/v1/subscriptions", tags=["push"], status_code=201, responses=ERRORS)
    async def create_subscription(body: SubscriptionIn) -> Response:
        """Push a topic's events to a webhook: at-least-once, retries with backoff, then the group's DLQ."""
        processor()
        return json_response(await push.create(body.model_dump()), 201)

    @router.get("/v1/subscriptions", tags=["push"])
    async def list_subscriptions() -> Response:
        processor()
        return json_response(push.list())

    @router.get("/v1/subscriptions/{sid}", tags=["push"], responses=ERRORS)
    async def get_subscription(sid: str) -> Response:
        processor()
        return json_response(push.get(sid))

    @router.delete("/v1/subscriptions/{sid}", tags=["push"], status_code=204, response_class=Response, responses=ERRORS)
    async def delete_subscription(sid: str) -> Response:
        processor()
        await push.delete(sid)
        return Response(status_code=204)

    return router
