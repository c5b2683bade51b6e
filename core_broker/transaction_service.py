"""TransactionService: half messages, commit / rollback, and checking back with producers.

A transactional message is stored once in the system half queue, invisible to
consumers. Commit links it into its real queue (one record, journaled with
it); rollback journals the outcome only. A half left open longer than the
check immunity is checked back through a callback the gRPC door registers
(it asks a live producer over its Telemetry stream), repeatedly, up to the
configured maximum, after which it is rolled back. One task sleeps until the
next half is due a check (not at all while none is open: see ``DeadlineLoop``).
Pending halves are found again after a restart by rescanning the half queue
from the tracker's mark.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from .config import BrokerConfig
from .deadline_loop import DeadlineLoop
from .errors import UnimqError
from .journal import Journal
from .message_store import MessageStore
from .model import Message, PutResult, StoredMessage
from .system_queue import park, unfinished
from .system_queue_tracker import SystemQueueTracker
from .system_topics import HALF_TOPIC, P_PRODUCER_GROUP, P_REAL_QUEUE, P_REAL_TOPIC, public_properties

log = logging.getLogger("unimq.transaction")

# checker(topic, producer_group, message, transaction_id) -> True if a producer was asked
TransactionChecker = Callable[[str, str, StoredMessage, str], Awaitable[bool]]


# How long a check handed to a gateway may stay without an outcome before it counts as
# delivered (the gateway died with it); longer than a gateway waits for its producer.
IN_FLIGHT_TIMEOUT_S = 60.0


class TransactionCheckLostError(UnimqError):
    """Raised by a checker whose check was accepted for a producer but lost on the way
    (the gateway or door holding it stopped): the broker does not count that check."""

    code = "TRANSACTION_CHECK_LOST"


class TransactionNotFoundError(UnimqError):
    code = "INVALID_TRANSACTION_ID"


@dataclass
class HalfMessage:
    half_offset: int
    phys: int
    topic: str
    queue_id: int
    producer_group: str
    born_ms: int
    checks: int = 0
    last_check_ms: int = 0
    # A check handed to a gateway whose outcome (reached a producer, or lost on the way)
    # is not known yet: no new check and no rollback before it is (monotonic deadline).
    in_flight_until: float = 0.0


class TransactionService:
    def __init__(
        self, store: MessageStore, journal: Journal, config: BrokerConfig, notify: Callable[[str], None]
    ) -> None:
        self.store = store
        self.journal = journal
        self.config = config
        self.notify = notify
        self.tracker = SystemQueueTracker()
        self.pending: dict[str, HalfMessage] = {}
        self._checks: dict[int, int] = {}  # half offset -> checks made (snapshotted)
        self.checker: TransactionChecker | None = None
        # the longest sleep while a half is open (bounds a wall-clock step's effect), and
        poll_s = max(0.05, min(config.transaction_check_interval_ms, config.transaction_check_immunity_ms, 1000) / 1000)
        # the wait before the first round: the door that asks producers starts after the broker
        self._loop = DeadlineLoop("unimq-txn-check", self._round, max_sleep_s=poll_s, first_delay_s=poll_s)
        # Asked before each round: true while nobody could receive checks (a separated
        # broker with no gateway connected); checks then wait instead of being counted unheard.
        self.hold_checks: Callable[[], bool] | None = None

    def transaction_id(self, phys: int) -> str:
        return f"{self.store.store_id}{phys:016X}"

    # -- state ---------------------------------------------------------------------

    def apply(self, op: str, data: dict) -> None:
        if op == "tend":
            self.tracker.mark_done(int(data["hq"]))
            self._checks.pop(int(data["hq"]), None)
        elif op == "tcheck":
            self._checks[int(data["hq"])] = int(data["n"])

    def rebuild(self) -> None:
        self.pending.clear()
        for m in unfinished(self.store, HALF_TOPIC, self.tracker):
            self._track(m.queue_offset, m.commitlog_offset, m)

    def _track(self, half_offset: int, phys: int, m: Message) -> str:
        tid = self.transaction_id(phys)
        self.pending[tid] = HalfMessage(
            half_offset,
            phys,
            m.properties.get(P_REAL_TOPIC, ""),
            int(m.properties.get(P_REAL_QUEUE, "0")),
            m.properties.get(P_PRODUCER_GROUP, ""),
            m.born_timestamp_ms or int(time.time() * 1000),
            self._checks.get(half_offset, 0),
        )
        self._loop.wake()
        return tid

    def snapshot(self) -> dict:
        return {"tracker": self.tracker.to_json(), "checks": {str(k): v for k, v in self._checks.items()}}

    def load(self, d: dict | None) -> None:
        d = d or {}
        self.tracker = SystemQueueTracker.from_json(d.get("tracker"))
        self._checks = {int(k): int(v) for k, v in d.get("checks", {}).items()}

    # -- operations ------------------------------------------------------------------

    def prepare(self, msg: Message, producer_group: str = "") -> tuple[PutResult, str]:
        extra = {P_PRODUCER_GROUP: producer_group} if producer_group else {}
        half = park(msg, HALF_TOPIC, extra, born_timestamp_ms=msg.born_timestamp_ms or int(time.time() * 1000))
        props = half.properties
        r = self.store.put_nowait(half)
        half.properties = props
        tid = self._track(r.queue_offset, r.commitlog_offset, half)
        return r, tid

    def end(self, transaction_id: str, commit: bool, source: str = "client") -> PutResult | None:
        """Resolve a half message. Returns the journal/commit record to wait on."""
        h = self.pending.pop(transaction_id, None)
        if h is None:
            raise TransactionNotFoundError(f"no open transaction {transaction_id!r} (already resolved or unknown)")
        data = {"hq": h.half_offset, "c": int(commit), "s": source}
        if commit:
            r = self.journal.link(h.phys, h.topic, h.queue_id, "tend", data)
            self.notify(h.topic)
        else:
            r = self.journal.append("tend", data)
        self.tracker.mark_done(h.half_offset)
        self._checks.pop(h.half_offset, None)
        return r

    def uncount_check(self, transaction_id: str) -> None:
        """A check that never reached a producer (its queue died with a stop) does not count."""
        h = self.pending.get(transaction_id)
        if h is None:
            return
        h.in_flight_until = 0.0
        if h.checks <= 0:
            return
        h.checks -= 1
        h.last_check_ms = 0
        self._checks[h.half_offset] = h.checks
        self.journal.append("tcheck", {"hq": h.half_offset, "n": h.checks})
        self._loop.wake()  # due again at once

    def check_in_flight(self, transaction_id: str, timeout_s: float = IN_FLIGHT_TIMEOUT_S) -> None:
        """A check left the broker (separated mode: a gateway took it to hand it to a producer).

        Until :meth:`check_outcome` says what became of it (or ``timeout_s`` passes: the
        gateway died, the check counts), the transaction is neither checked again nor rolled
        back: a last check still on its way must not be overtaken by the rollback after
        the maximum, nor counted when a stopping gateway could not deliver it.
        """
        h = self.pending.get(transaction_id)
        if h is not None:
            h.in_flight_until = time.monotonic() + timeout_s

    def check_outcome(self, transaction_id: str, delivered: bool) -> None:
        """What became of a check in flight: it reached (or could not find) a producer and
        counts, or it was lost on the way (a gateway stopped with it) and does not."""
        if delivered:
            h = self.pending.get(transaction_id)
            if h is not None:
                h.in_flight_until = 0.0
                self._loop.wake()
        else:
            self.uncount_check(transaction_id)

    def message_of(self, transaction_id: str) -> StoredMessage | None:
        h = self.pending.get(transaction_id)
        if h is None:
            return None
        m = self.store.read_phys(h.phys)
        m.topic = h.topic
        m.queue_id = h.queue_id
        m.properties = public_properties(m.properties)
        return m

    async def check_round(self) -> None:
        """Ask producers about halves past the immunity; roll back those checked too often."""
        now = int(time.time() * 1000)
        mono = time.monotonic()
        if self.hold_checks is not None and self.hold_checks():
            return
        cfg = self.config
        for tid, h in list(self.pending.items()):
            if now - h.born_ms < cfg.transaction_check_immunity_ms:
                continue
            if h.in_flight_until:
                if mono < h.in_flight_until:
                    continue  # the last check's outcome is not known yet
                h.in_flight_until = 0.0
            if h.last_check_ms and now - h.last_check_ms < cfg.transaction_check_interval_ms:
                continue
            if h.checks >= cfg.transaction_check_max:
                log.info("transaction %s unresolved after %d checks: rolled back", tid, h.checks)
                try:
                    self.end(tid, False, "max_checks")
                except TransactionNotFoundError:
                    pass
                continue
            h.checks += 1
            h.last_check_ms = now
            self._checks[h.half_offset] = h.checks
            self.journal.append("tcheck", {"hq": h.half_offset, "n": h.checks})
            checker = self.checker
            msg = self.message_of(tid)
            if checker is not None and msg is not None:
                try:
                    await checker(h.topic, h.producer_group, msg, tid)
                except TransactionCheckLostError:
                    self.uncount_check(tid)
                except Exception:
                    log.exception("transaction check callback failed for %s", tid)

    def next_due_s(self) -> float | None:
        """Seconds until some open half is due a check (or its rollback); None: none is open."""
        if not self.pending:
            return None
        now = time.time() * 1000
        mono = time.monotonic()
        cfg = self.config
        due = float("inf")
        for h in self.pending.values():
            if h.in_flight_until and mono < h.in_flight_until:
                at = now + (h.in_flight_until - mono) * 1000
            else:
                at = h.born_ms + cfg.transaction_check_immunity_ms
                if h.last_check_ms:
                    at = max(at, h.last_check_ms + cfg.transaction_check_interval_ms)
            if at < due:
                due = at
        return max(0.001, (due - now) / 1000)

    async def _round(self) -> float | None:
        await self.check_round()
        if self.pending and self.hold_checks is not None and self.hold_checks():
            return self._loop.max_sleep_s  # nobody to ask yet: look again after the poll period
        return self.next_due_s()

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
