"""The HTTP door's topic admin routes: list and create (``/v1/topics``), describe, update and delete one.

Why two routers: describing, updating and deleting a topic answer at ``/v1/topics/{topic}``
where the topic name may hold slashes, so that path matches any suffix;
:func:`named_router` must be included after every other ``/v1/topics/...``
route (``create_app`` does), or it would shadow them.
"""

from __future__ import annotations

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from core_broker.errors import UnimqError
from core_broker.model import MessageType
from gateway.auth import Action, ForbiddenError, Resource
from gateway.context import INTERNAL

from .http_models import ERRORS, ErrorOut, MappingOut, QueueMove, TopicCreate, TopicOut, TopicUpdate
from .http_request import Deps, request_context
from .http_responses import json_response, topic_json

__all__ = ["named_router", "router"]


def router(deps: Deps) -> APIRouter:
    """``GET``/``POST /v1/topics``: every topic, or a new one."""
    processor = deps.processor
    router = APIRouter()

    @router.get("/v1/topics", tags=["topics"], response_model=list[TopicOut])
    async def list_topics(
        request: Request,
        include_system: bool = Query(False, description="also list %DLQ%, %RETRY% and other system topics"),
    ) -> Response:
        """Every topic with its queues' min/max offsets."""
        p = processor()
        ctx = request_context(request, "http")
        out = []
        for tc in await p.list_topics(ctx, include_system):
            try:
                out.append(topic_json(await p.describe_topic(ctx, tc.name)))
            except UnimqError:  # deleted meanwhile
                continue
        return json_response(out)

    @router.post("/v1/topics", tags=["topics"], status_code=201, response_model=TopicOut,
                 responses={200: {"model": TopicOut, "description": "already exists with this type"},
                            409: {"model": ErrorOut, "description": "exists with another type"}, **ERRORS})
    async def create_topic(body: TopicCreate, request: Request) -> Response:
        """Create a topic (201); 200 if it exists with the same type, 409 if with another type."""
        p = processor()
        ctx = request_context(request, "http")
        mtype = MessageType(body.type.upper())
        existed = True
        try:
            await p.describe_topic(ctx, body.name)
        except UnimqError:
            existed = False
        await p.create_topic(ctx, body.name, body.queues, mtype, exist_ok=True, attributes=body.attributes or None)
        status = 200 if existed else 201
        try:
            return json_response(topic_json(await p.describe_topic(ctx, body.name)), status)
        except ForbiddenError:  # may create, may neither publish nor subscribe: no offsets to show
            return json_response({"name": body.name, "type": mtype.value, "queues": []}, status)

    @router.post("/v1/topics/{topic:path}/remap", tags=["topics"], response_model=MappingOut, responses=ERRORS)
    async def remap_queue(body: QueueMove, request: Request, topic: str = Path(description="a static topic")) -> Response:
        """Write a static topic's logic queue on another broker from now on (admin). Nothing is
        copied: older offsets are read where they were written; logic offsets go on growing."""
        mapping = await processor().remap_queue(request_context(request, "http"), topic, body.queue, body.broker)
        return json_response({"name": topic, "mapping": mapping})

    @router.post("/v1/topics/{topic:path}/release", tags=["topics"], response_model=MappingOut, responses=ERRORS)
    async def release_queue(body: QueueMove, request: Request, topic: str = Path(description="a static topic")) -> Response:
        """Scale-in (admin): forget a broker's old part of a static topic's logic queue once every
        consumer group consumed it; 400 naming the groups behind until then."""
        mapping = await processor().release_queue(request_context(request, "http"), topic, body.queue, body.broker)
        return json_response({"name": topic, "mapping": mapping})


    return router


def named_router(deps: Deps) -> APIRouter:
    """``GET``/``PATCH``/``DELETE /v1/topics/{topic}``: include it last (its path matches any suffix)."""
    processor = deps.processor
    router = APIRouter()

    @router.get("/v1/topics/{topic:path}", tags=["topics"], response_model=TopicOut, responses=ERRORS)
    async def describe_topic(request: Request, topic: str = Path(description="topic name")) -> Response:
        """A topic's type and its queues' min/max offsets."""
        p = processor()
        return json_response(topic_json(await p.describe_topic(request_context(request, "http"), topic)))

    @router.patch("/v1/topics/{topic:path}", tags=["topics"], response_model=TopicOut, responses=ERRORS)
    async def update_topic(body: TopicUpdate, request: Request, topic: str = Path(description="topic name")) -> Response:
        """Change a topic's attributes: merged into its own, a null value removing one; checked as at
        creation (400); needs the permission creating the topic needs, or admin. Every broker holding
        the topic takes the change."""
        p = processor()
        ctx = request_context(request, "http")
        tc = await p.update_topic(ctx, topic, attributes=body.attributes)
        try:
            return json_response(topic_json(await p.describe_topic(ctx, topic)))
        except ForbiddenError:  # may change it, may neither publish nor subscribe: no offsets to show
            return json_response({"name": topic, "type": tc.message_type.value, "queues": [],
                                  "attributes": dict(tc.attributes)})

    @router.delete("/v1/topics/{topic:path}", tags=["topics"], status_code=204, response_class=Response,
                   responses=ERRORS)
    async def delete_topic(request: Request, topic: str = Path(description="topic name")) -> Response:
        """Delete a topic and its messages' queues (needs the delete permission on it)."""
        p = processor()
        ctx = request_context(request, "http")
        p.authorize(ctx, Action.DELETE, Resource.TOPIC, topic)  # 403 before 404: existence is not leaked
        await p.describe_topic(INTERNAL, topic)  # 404 for an unknown topic
        await p.delete_topic(ctx, topic)
        return Response(status_code=204)

    return router
