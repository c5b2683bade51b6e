"""Assembling a processor over an in-process broker: the merged deployment's one recipe.

Merged mode (``unimq up``) and the tests and benchmarks that want "gateway and
broker in one process" build their processor here, so the two cannot drift.
The separated shape (gateways in front of brokers found through the
nameserver) plugs a ``RemoteBrokerClient`` into the same processor instead.
"""

from __future__ import annotations

from core_broker.broker_controller import BrokerController
from core_broker.config import BrokerConfig, StoreConfig

from .broker_client import LocalBrokerClient
from .api import DEFAULT_DOOR_MESSAGE_SIZE
from .processor import MessagingProcessor, ProcessorConfig

__all__ = ["local_processor", "merged_processor"]


def local_processor(controller: BrokerController, config: ProcessorConfig, *, owns: bool = True) -> MessagingProcessor:
    """A processor calling ``controller`` in-process.

    ``owns``: the processor starts and stops the controller (and so opens and
    shuts down its store); false when something else does (``unimq up``'s
    broker, which also serves it over RPC).
    """
    controller.pops.trace.default = config.trace_sample_rate  # the broker's own trace events follow it
    return MessagingProcessor(LocalBrokerClient(controller, owns=owns), config)


def merged_processor(
    store: StoreConfig, broker: BrokerConfig | None = None, processor: ProcessorConfig | None = None
) -> MessagingProcessor:
    """A processor over its own in-process broker; ``await p.start()`` opens (and recovers) the store."""
    cfg = processor or ProcessorConfig(max_message_size=min(store.max_message_size, DEFAULT_DOOR_MESSAGE_SIZE))
    return local_processor(BrokerController(store, broker), cfg)
