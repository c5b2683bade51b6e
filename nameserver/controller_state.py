"""The controller's state machine for replicated broker groups (issue 16), sans-io.

This is what the Raft log replicates: every change is a deterministic method on
`ControllerState`, so each controller node applying the same log holds the same groups. The
consensus itself comes from a library (pysyncobj), never from here. The design follows RocketMQ 5's
controller mode: per group a master id with a master epoch, and an in-sync set ("SyncStateSet")
with its own epoch; only the current master, quoting both epochs, may change the set
(compare-and-set), and an election raises the master epoch so a deposed master is fenced.

Heartbeats are not state: `LeaseTable` is the Raft leader's in-memory view of which brokers are
alive and how far each has confirmed; it decides when an election is due and with whom.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core_broker.errors import InvalidArgumentError, StaleEpochError, UnimqError


class GroupNotFoundError(UnimqError):
    code = "GROUP_NOT_FOUND"


class NotLeaderError(UnimqError):
    """This controller node is not the Raft leader; `leader` names the one to ask (or None)."""

    code = "NOT_LEADER"

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the controller leader; try {leader or 'later'}", leader=leader)
        self.leader = leader


@dataclass(frozen=True)
class GroupState:
    """A broker group as the controller knows it; what every controller call answers."""

    group: str
    master_id: str | None  # None: no master (election pending or impossible): refuse writes
    master_addr: str | None  # "host:port" of the master's broker RPC
    master_epoch: int
    in_sync: frozenset[str]  # broker ids, master included
    in_sync_epoch: int
    members: dict[str, str]  # broker id -> "host:port"


@dataclass
class Member:
    broker_id: str
    addr: str
    priority: int = 0


@dataclass
class _Group:
    name: str
    members: dict[str, Member] = field(default_factory=dict)
    master_id: str | None = None
    master_epoch: int = 0
    in_sync: frozenset[str] = frozenset()
    in_sync_epoch: int = 0

    def view(self) -> GroupState:
        master = self.members.get(self.master_id) if self.master_id else None
        return GroupState(
            group=self.name,
            master_id=self.master_id,
            master_addr=master.addr if master else None,
            master_epoch=self.master_epoch,
            in_sync=self.in_sync,
            in_sync_epoch=self.in_sync_epoch,
            members={m.broker_id: m.addr for m in self.members.values()},
        )


class ControllerState:
    """Every broker group; mutated only by applying committed log entries."""

    def __init__(self) -> None:
        self.groups: dict[str, _Group] = {}

    def group_state(self, group: str) -> GroupState:
        g = self.groups.get(group)
        if g is None:
            raise GroupNotFoundError(f"no broker group {group!r}", group=group)
        return g.view()

    def cluster_state(self) -> dict[str, GroupState]:
        return {name: g.view() for name, g in sorted(self.groups.items())}

    def member(self, group: str, broker_id: str) -> Member | None:
        g = self.groups.get(group)
        return g.members.get(broker_id) if g else None

    def register(self, group: str, broker_id: str, addr: str, priority: int = 0) -> GroupState:
        """A broker's first heartbeat (or a changed address/priority). The first broker of a new
        group becomes its master at epoch 1, alone in the in-sync set."""
        g = self.groups.setdefault(group, _Group(group))
        g.members[broker_id] = Member(broker_id, addr, priority)
        if g.master_epoch == 0:
            g.master_id = broker_id
            g.master_epoch = 1
            g.in_sync = frozenset({broker_id})
            g.in_sync_epoch = 1
        return g.view()

    def alter_in_sync(
        self, group: str, master_id: str, master_epoch: int, in_sync_epoch: int, new_in_sync: frozenset[str]
    ) -> GroupState:
        """Compare-and-set of the in-sync set: only the current master quoting both current epochs."""
        g = self.groups.get(group)
        if g is None:
            raise GroupNotFoundError(f"no broker group {group!r}", group=group)
        if master_id != g.master_id or master_epoch != g.master_epoch or in_sync_epoch != g.in_sync_epoch:
            raise StaleEpochError(
                f"group {group}: master {g.master_id} epoch {g.master_epoch}, in-sync epoch {g.in_sync_epoch};"
                f" quoted {master_id} {master_epoch}/{in_sync_epoch}",
                group=group,
                master_epoch=g.master_epoch,
                in_sync_epoch=g.in_sync_epoch,
            )
        new = frozenset(new_in_sync)
        if master_id not in new:
            raise InvalidArgumentError("the in-sync set must hold the master", group=group)
        unknown = new - set(g.members)
        if unknown:
            raise InvalidArgumentError(f"not members of {group}: {sorted(unknown)}", group=group)
        if new != g.in_sync:
            g.in_sync = new
            g.in_sync_epoch += 1
        return g.view()

    def elect(self, group: str, live_offsets: dict[str, int], allow_unclean: bool) -> GroupState:
        """Choose a new master among live in-sync members (most advanced confirmed offset, then
        priority, then id so every node picks alike); outside the set only when unclean elections
        are allowed. With nobody eligible the group has no master (it refuses writes) rather than
        losing acknowledged data. Any change of master raises the master epoch (fencing)."""
        g = self.groups.get(group)
        if g is None:
            raise GroupNotFoundError(f"no broker group {group!r}", group=group)
        live = {b: off for b, off in live_offsets.items() if b in g.members}
        candidates = [b for b in live if b in g.in_sync]
        if not candidates and allow_unclean:
            candidates = list(live)
        if not candidates:
            if g.master_id is not None:
                g.master_id = None
                g.master_epoch += 1
            return g.view()
        best = max(candidates, key=lambda b: (live[b], g.members[b].priority, b))
        if best == g.master_id:
            return g.view()
        g.master_id = best
        g.master_epoch += 1
        # The others rejoin after truncating to the new master's history and catching up;
        # after an unclean election nothing else can be assumed in sync either.
        g.in_sync = frozenset({best})
        g.in_sync_epoch += 1
        return g.view()

    # snapshots: plain data so pysyncobj (pickle) and any other backend can store it
    def to_data(self) -> dict[str, dict[str, object]]:
        return {
            name: {
                "members": [(m.broker_id, m.addr, m.priority) for m in g.members.values()],
                "master_id": g.master_id,
                "master_epoch": g.master_epoch,
                "in_sync": sorted(g.in_sync),
                "in_sync_epoch": g.in_sync_epoch,
            }
            for name, g in self.groups.items()
        }

    @classmethod
    def from_data(cls, data: dict[str, dict[str, object]]) -> ControllerState:
        state = cls()
        for name, d in data.items():
            members = d["members"]
            assert isinstance(members, list)
            g = _Group(name, members={b: Member(b, a, p) for b, a, p in members})
            master_id, in_sync = d["master_id"], d["in_sync"]
            g.master_id = master_id if isinstance(master_id, str) else None
            g.master_epoch = int(str(d["master_epoch"]))
            g.in_sync = frozenset(in_sync) if isinstance(in_sync, list) else frozenset()
            g.in_sync_epoch = int(str(d["in_sync_epoch"]))
            state.groups[name] = g
        return state


@dataclass
class _Beat:
    at: float
    offset: int


class LeaseTable:
    """The Raft leader's memory of heartbeats (never written to the log). A node that has just
    become leader has no history, so it elects nobody before one full lease has passed."""

    def __init__(self, lease_s: float, now: float) -> None:
        self.lease_s = lease_s
        self.since = now
        self._beats: dict[tuple[str, str], _Beat] = {}

    def beat(self, group: str, broker_id: str, confirmed_offset: int, now: float) -> None:
        self._beats[(group, broker_id)] = _Beat(now, confirmed_offset)

    def offset(self, group: str, broker_id: str) -> int | None:
        beat = self._beats.get((group, broker_id))
        return beat.offset if beat else None

    def live(self, group: str, now: float) -> dict[str, int]:
        return {
            b: beat.offset for (g, b), beat in self._beats.items() if g == group and now - beat.at <= self.lease_s
        }

    def elections_due(self, state: ControllerState, now: float) -> list[str]:
        """Groups whose master's lease has lapsed, or that have no master but a live member."""
        if now - self.since < self.lease_s:
            return []
        due = []
        for name, g in state.groups.items():
            live = self.live(name, now)
            if g.master_id is None:
                if live:
                    due.append(name)
            elif g.master_id not in live:
                due.append(name)
        return due
