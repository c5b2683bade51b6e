"""Client certificates as identities: the user name a verified TLS client certificate carries.

Mosquitto's ``use_identity_as_username`` and RabbitMQ's
``rabbitmq_auth_mechanism_ssl`` (``ssl_cert_login_from = common_name``) both take
the subject's common name (CN) of a client certificate the listener verified
as the user name, with no password. Every door does the same here: the MQTT
door (``mqtt_use_identity_as_username``), the AMQP door's EXTERNAL mechanism
and the HTTP door (``http_cert_identity``) ask :func:`cert_identity` of their
connection's transport.

Only a certificate the TLS layer *verified* against ``tls_client_ca``
(``tls_verify_client`` optional or required) counts: ``getpeercert()`` answers
an empty dict for anything else. With users in the identity store, the name
must be one of them (:func:`known_identity`), so deleting a user ends its
certificate's logins as it ends its password's.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cert_identity", "common_name", "is_tls", "known_identity"]


def common_name(peercert: dict[str, Any] | None) -> str | None:
    """The subject's CN of a certificate as ``SSLSocket.getpeercert()`` returns it; None without one."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and isinstance(value, str) and value:
                return value
    return None


def cert_identity(transport: Any) -> str | None:
    """The CN of the verified client certificate of a connection (a TLS transport), else None."""
    get = getattr(transport, "get_extra_info", None)
    if get is None:
        return None
    ssl_object = get("ssl_object")
    if ssl_object is None:
        return None
    try:
        return common_name(ssl_object.getpeercert())
    except ValueError:  # the handshake has not completed
        return None


def is_tls(transport: Any) -> bool:
    get = getattr(transport, "get_extra_info", None)
    return get is not None and get("ssl_object") is not None


def known_identity(identities: Any, name: str | None) -> bool:
    """May ``name`` (a certificate's CN) log in: a user of the store, or anyone while the store has none."""
    if not name:
        return False
    if identities is None or not identities.has_users:
        return True
    return name in identities.snapshot.users
