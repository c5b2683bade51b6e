"""The process's identity store and authorizer, and the secure-by-default start-up rule.

Why here (the application) and not in a role: both roles that serve doors
(``unimq up``, ``unimq gateway``) load users and permissions from the brokers'
door state once their processor can reach a broker, install one authorizer in
the processor for every door, and must refuse the same unsafe start-up:
doors on a non-loopback address with no users and without ``allow_anonymous``
(as Mosquitto 2 listens on localhost only without a configuration, and
RabbitMQ's ``guest`` logs in from localhost only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core_broker.errors import ConfigurationError
from gateway.access.authorizer import StoreAuthorizer, host_is_loopback
from gateway.access.store import IdentityStore
from gateway.access.login_throttle import LoginThrottle
from gateway.access.tokens import JwtSettings, JwtVerifier
from gateway.access.traffic import TrafficControl

from .node import StartupError

if TYPE_CHECKING:
    from gateway.processor import MessagingProcessor

    from .settings import UnimqSettings

__all__ = ["insecure_start_message", "start_identities"]


def insecure_start_message(host: str) -> str:
    return (
        f"refusing to serve clients on {host} with no users configured: anyone who can reach it could read, "
        "write and delete every topic. Either add a user first (start on 127.0.0.1, then "
        "`unimq user add NAME --admin`), or set allow_anonymous = true (--set allow_anonymous=true) "
        "to serve clients without credentials on purpose"
    )


async def start_identities(settings: UnimqSettings, processor: MessagingProcessor) -> IdentityStore:
    """Load users and permissions, install the authorizer, refuse an unsafe start (StartupError)."""
    store = IdentityStore(processor, settings.auth_refresh_s)
    store.throttle = LoginThrottle(settings.login_throttle_failures, settings.login_throttle_window_s,
                                   settings.login_throttle_max_delay_s,
                                   on_delay=lambda door: processor.metrics.inc("login_throttled", door),
                                   loopback=settings.login_throttle_loopback)
    store.traffic = TrafficControl(settings.quota_refuse_after_s, settings.quota_burst_s)
    if settings.jwt_issuers:
        try:
            store.jwt = JwtVerifier(JwtSettings(
                tuple(settings.jwt_issuers), tuple(settings.jwt_key_files), settings.jwt_audience,
                settings.jwt_oidc_discovery, tuple(settings.jwt_algorithms), settings.jwt_user_claim,
                settings.jwt_roles_claim, settings.jwt_leeway_s))
        except ConfigurationError as e:
            raise StartupError(str(e)) from None
        await store.jwt.start()
    await store.start()
    loopback = host_is_loopback(settings.host)
    if not loopback and not store.has_users and not settings.allow_anonymous:
        await store.stop()
        raise StartupError(insecure_start_message(settings.host))
    processor.set_authorizer(StoreAuthorizer(store, processor.metrics, allow_anonymous=settings.allow_anonymous,
                                             loopback_only=loopback))
    return store
