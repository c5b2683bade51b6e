"""What the store asks of a second tier of its log (``core_broker.tier``), as a protocol.

Why a module of its own: the store must not import the tier (boto3, threads, the network
are the tier's business, and the tier imports the store), yet two of its paths depend on
it: local retention may delete a segment only once the tier holds it, and a link (a retry
of a message popped from the tier) may have to read an origin that left local disk.
"""

from __future__ import annotations

from typing import Protocol

from .mapped_file import MappedFile
from .model import StoredMessage


class SegmentKeeper(Protocol):
    def may_delete(self, segment: MappedFile) -> bool:
        """Retention's question: may this sealed segment go from local disk?"""
        ...

    def read_record(self, offset: int) -> StoredMessage:
        """The record at a commitlog offset no longer on local disk, as stored (a link unresolved)."""
        ...

    def record_link_origin(self, offset: int) -> tuple[int, int]:
        """(origin offset, origin size) of a link record no longer on local disk; (-1, 0) otherwise."""
        ...
