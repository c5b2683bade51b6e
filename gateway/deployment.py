"""Assembling a processor for a deployment shape.

Merged mode (``unimq up``): one BrokerController in this process behind a
LocalBrokerClient. The separated shape (gateways in front of brokers found
through the nameserver) plugs a remote broker client into the same processor.
"""

from __future__ import annotations

from core_broker.broker_controller import BrokerController
from core_broker.config import BrokerConfig, StoreConfig

from .broker_client import LocalBrokerClient
from .processor import MessagingProcessor, ProcessorConfig


def merged_processor(
    store: StoreConfig, broker: BrokerConfig | None = None, processor: ProcessorConfig | None = None
) -> MessagingProcessor:
    """A processor over an in-process broker; ``await p.start()`` opens (and recovers) the store."""
    controller = BrokerController(store, broker)
    cfg = processor or ProcessorConfig(max_message_size=store.max_message_size)
    return MessagingProcessor(LocalBrokerClient(controller), cfg)
