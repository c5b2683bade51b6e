"""The processor's contracts checked statically: mypy over the contract's modules and this file.

The functions below only type-check when ``MessagingProcessor`` is a ``MessagingAPI``
and both broker clients are ``BrokerClient``s (protocols are structural: a missing
method, a changed parameter or return type is an error here, before any door runs).
tests/test_processor_contract.py checks the same at run time by reading the classes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.api import MessagingAPI
from gateway.broker_client import BrokerClient, LocalBrokerClient
from gateway.processor import MessagingProcessor
from gateway.remote_broker_client import RemoteBrokerClient

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = [
    "gateway/api.py", "gateway/auth.py", "gateway/context.py", "gateway/broker_client.py",
    "gateway/remote_broker_client.py", "gateway/processor.py", "gateway/send_plan.py", "gateway/namespace.py",
    "gateway/processor_rpc.py",
]


def _processor_is_the_api(p: MessagingProcessor) -> MessagingAPI:
    return p


def _local_client_is_a_broker_client(c: LocalBrokerClient) -> BrokerClient:
    return c


def _remote_client_is_a_broker_client(c: RemoteBrokerClient) -> BrokerClient:
    return c


def test_the_contract_type_checks() -> None:
    api = pytest.importorskip("mypy.api", reason="mypy is in the test extra: pip install -e '.[test]'")
    out, err, status = api.run([
        "--ignore-missing-imports", "--follow-imports=silent", "--no-incremental", "--cache-dir=/dev/null",
        *[str(ROOT / f) for f in CONTRACT], __file__,
    ])
    assert status == 0, out + err
