"""The map of a static topic's logic queues (core_broker/logic_queue.py): locating offsets in a
chain of items, sealing and extending (a remap), releasing the head (scale-in), JSON round trip."""

from __future__ import annotations

import pytest

from core_broker.errors import BadRequestError
from core_broker.logic_queue import OPEN, MappingItem, QueueMapping


def test_initial_spreads_logic_queues_as_contiguous_ranges() -> None:
    mp = QueueMapping.initial(5, ["a", "b"])
    assert [mp.last(q).broker for q in range(5)] == ["a", "a", "a", "b", "b"]
    assert mp.epoch == 1 and all(mp.leader(q) == MappingItem(mp.last(q).broker, 0, 0, OPEN) for q in range(5))
    assert [QueueMapping.initial(2, ["a", "b", "c"]).last(q).broker for q in range(2)] == ["a", "b"]
    with pytest.raises(BadRequestError):
        QueueMapping.initial(2, [])


def test_remap_chain_keeps_logic_offsets_dense_and_locates_each_item() -> None:
    mp = QueueMapping.initial(2, ["a"])
    mp = mp.sealed(0, 7)                       # a held logic 0..6 at physical 0..6
    assert mp.leader(0) is None and mp.epoch == 2
    mp = mp.extended(0, "b", 3)                # b's physical queue 0 already held 3 (older) entries
    mp = mp.sealed(0, 13).extended(0, "a", 7)  # back on a: its physical queue continues at 7
    assert mp.chain(0) == [MappingItem("a", 0, 0, 7), MappingItem("b", 7, 3, 13), MappingItem("a", 17, 7)]
    assert mp.epoch == 5 and mp.leader(0) == MappingItem("a", 17, 7)
    assert mp.locate(0, 0) == (0, mp.chain(0)[0])
    assert mp.locate(0, 6)[0] == 0 and mp.locate(0, 7)[0] == 1  # an item's end is the next one's start
    assert mp.locate(0, 16)[0] == 1 and mp.locate(0, 17)[0] == 2 and mp.locate(0, 10**9)[0] == 2
    b = mp.chain(0)[1]
    assert b.to_phys(9) == 5 and b.to_logic(12) == 16 and b.logic_end == 17
    assert mp.chain(0)[2].to_phys(20) == 10
    assert mp.brokers() == ["a", "b"]
    assert QueueMapping.from_json(mp.to_json()) == mp
    assert mp.items_on("b") == [(0, b)]


def test_changes_refuse_what_would_lose_or_reorder_offsets() -> None:
    mp = QueueMapping.initial(1, ["a"])
    with pytest.raises(BadRequestError, match="seal it first"):
        mp.extended(0, "b", 0)
    with pytest.raises(BadRequestError, match="before its start"):
        mp.sealed(0, -1)
    sealed = mp.sealed(0, 4)
    with pytest.raises(BadRequestError, match="already sealed"):
        sealed.sealed(0, 5)
    with pytest.raises(BadRequestError, match="logic queues 0 to 0"):
        mp.chain(1)
    chain = sealed.extended(0, "b", 0).sealed(0, 2).extended(0, "c", 0)
    with pytest.raises(BadRequestError, match="no closed item"):
        chain.released(0, "b")  # b's item is in the middle: a read would jump a hole
    with pytest.raises(BadRequestError, match="no closed item"):
        chain.released(0, "c")  # the item written now never goes
    head = chain.released(0, "a")
    assert head.chain(0) == [MappingItem("b", 4, 0, 2), MappingItem("c", 6, 0)] and head.logic_min(0) == 4
    assert head.released(0, "b").chain(0) == [MappingItem("c", 6, 0)]
