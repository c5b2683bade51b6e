"""A replica's local retention waits for its master's tier uploads.

Why: with tiered storage, only a group's master uploads sealed segments; a replica's
services (the tier among them) start when it is promoted. Its local retention used to
delete segments on its own clock, so a master that died before uploading a segment could
leave a promoted replica that no longer held it either: those messages were gone. Now the
master says with every fetch answer how far the tier holds its log (every segment ending
at or below that offset is confirmed in the tier), and a replica's retention deletes only
segments below it, as the master's own retention does. A replica that has not heard from
a master yet deletes nothing.
"""

from __future__ import annotations

from ..errors import CorruptRecordError
from ..mapped_file import MappedFile
from ..model import StoredMessage


class ReplicaTierGate:
    """The replica's ``store.tier`` (a ``SegmentKeeper``) until it is promoted."""

    def __init__(self) -> None:
        self.kept_below = 0  # every segment ending at or below this is in the tier

    def may_delete(self, segment: MappedFile) -> bool:
        return segment.end <= self.kept_below

    def read_record(self, offset: int) -> StoredMessage:  # a replica writes no links
        raise CorruptRecordError(f"no record at commitlog offset {offset} on this replica")

    def record_link_origin(self, offset: int) -> tuple[int, int]:
        raise CorruptRecordError(f"no record at commitlog offset {offset} on this replica")
