"""MessagingProcessor: static topics (logic queues) in every deployment shape: a fixed number of
logic queues, a message group or key always hashed to the same one, the map kept with the topic;
remapping one needs another broker (refused in the merged shape, done in the separated one)."""

from __future__ import annotations

import pytest

from core_broker.logic_queue import QueueMapping
from core_broker.model import Message, MessageType

from processor_fixtures import CTX, processor, processor_options  # noqa: F401  (fixtures)


async def test_static_topic_keeps_keys_in_their_logic_queue_and_remaps_where_it_can(processor) -> None:
    await processor.create_topic(CTX, "st", queues=4, message_type=MessageType.FIFO, attributes={"static": "true"})
    stats = await processor.describe_topic(CTX, "st")
    mp = QueueMapping.from_json(stats.config.mapping)
    assert len(stats.queues) == 4 and len(mp) == 4 and stats.config.attributes["static"] == "true"
    sent = await processor.send(CTX, [Message("st", str(i).encode(), message_group=f"g{i % 6}") for i in range(60)])
    queue_of: dict[str, int] = {}
    for i, r in enumerate(sent):
        assert queue_of.setdefault(f"g{i % 6}", r.queue_id) == r.queue_id
    q = sent[0].queue_id
    mine = [r for r in sent if r.queue_id == q]
    assert [r.queue_offset for r in mine] == list(range(len(mine)))
    others = [b for b in ["broker-a", "broker-b"] if b != mp.last(q).broker]
    if processor.shape == "merged":  # one broker
        with pytest.raises(Exception, match="separated deployment"):
            await processor.remap_queue(CTX, "st", q, "elsewhere")
        more = await processor.send(CTX, [Message("st", b"x", message_group="g0")])
    else:
        new = QueueMapping.from_json(await processor.remap_queue(CTX, "st", q, others[0]))
        assert [i.broker for i in new.chain(q)] == [mp.last(q).broker, others[0]]
        more = await processor.send(CTX, [Message("st", b"x", message_group="g0")])
        assert more[0].broker == others[0]
    assert more[0].queue_id == queue_of["g0"] == q and more[0].queue_offset == len(mine)
    r = await processor.pull(CTX, "st", q, 0, 256)
    while r.next_offset < len(mine) + 1 and r.messages:
        r2 = await processor.pull(CTX, "st", q, r.next_offset, 256)
        r = r._replace(messages=r.messages + r2.messages, next_offset=r2.next_offset)
    assert [m.queue_offset for m in r.messages] == list(range(len(mine) + 1))
    assert [m.body for m in r.messages][-1] == b"x"
    with pytest.raises(Exception, match="fixed"):
        await processor.update_topic(CTX, "st", queues=6)
