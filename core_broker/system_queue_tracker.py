"""Progress through a system queue whose entries complete out of order.

Timers fire and transactions resolve in any order, so "how far are we" is a
low-water mark (every entry below it is done) plus the set of done entries
above it. Both go into the broker snapshot; a restart rescans the queue from
the low-water mark and skips the done ones.
"""

from __future__ import annotations


class SystemQueueTracker:
    __slots__ = ("low_water", "done")

    def __init__(self, low_water: int = 0, done: set[int] | None = None) -> None:
        self.low_water = low_water
        self.done: set[int] = done or set()

    def mark_done(self, offset: int) -> None:
        if offset < self.low_water:
            return
        self.done.add(offset)
        while self.low_water in self.done:
            self.done.discard(self.low_water)
            self.low_water += 1

    def is_done(self, offset: int) -> bool:
        return offset < self.low_water or offset in self.done

    def to_json(self) -> dict:
        return {"low": self.low_water, "done": sorted(self.done)}

    @classmethod
    def from_json(cls, d: dict | None) -> "SystemQueueTracker":
        if not d:
            return cls()
        return cls(int(d.get("low", 0)), {int(x) for x in d.get("done", [])})
