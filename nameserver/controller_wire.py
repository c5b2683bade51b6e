"""GroupState as plain msgpack data, both ways (the controller's RPC answers)."""

from __future__ import annotations

from nameserver.controller_state import GroupState


def group_to_wire(s: GroupState) -> dict[str, object]:
    return {
        "group": s.group,
        "master_id": s.master_id,
        "master_addr": s.master_addr,
        "master_epoch": s.master_epoch,
        "in_sync": sorted(s.in_sync),
        "in_sync_epoch": s.in_sync_epoch,
        "members": dict(s.members),
    }


def group_from_wire(d: dict[str, object]) -> GroupState:
    in_sync, members = d["in_sync"], d["members"]
    assert isinstance(in_sync, list) and isinstance(members, dict)
    master_id, master_addr = d["master_id"], d["master_addr"]
    return GroupState(
        group=str(d["group"]),
        master_id=master_id if isinstance(master_id, str) else None,
        master_addr=master_addr if isinstance(master_addr, str) else None,
        master_epoch=int(str(d["master_epoch"])),
        in_sync=frozenset(str(b) for b in in_sync),
        in_sync_epoch=int(str(d["in_sync_epoch"])),
        members={str(k): str(v) for k, v in members.items()},
    )
