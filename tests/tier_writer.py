"""Child process of the tier's kill test (tests/test_tier_crash.py): write with the tier on, get killed.

Usage::

    python tests/tier_writer.py DATA_DIR ENDPOINT BUCKET FIRST_SEQ

Opens the store (recovering from whatever the last SIGKILL left) with its tier
attached, as the broker does, and puts messages whose body is a pure function of
their sequence number (:func:`body`) to topic ``K``, queue ``seq % 2``; after
each put returns it writes ``ACK <seq>`` to stdout with one ``os.write``, so
every line the parent reads names a stored message. Small segments make the log
roll, and uploads run, all the time. The parent SIGKILLs it at a random moment.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for p in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from core_broker.message_store import MessageStore  # noqa: E402
from core_broker.model import Message  # noqa: E402
from core_broker.tier import TierService  # noqa: E402
from store_helpers import make_config  # noqa: E402

TOPIC = "K"


def body(seq: int) -> bytes:
    d = hashlib.sha256(str(seq).encode()).digest()
    return (f"seq={seq};".encode() + d * 40)[: 200 + d[0] * 4]


def config(data_dir: str | Path, endpoint: str, bucket: str):
    return make_config(
        Path(data_dir), retention_hours=1.0, tier_enabled=True, tier_endpoint=endpoint, tier_bucket=bucket,
        tier_prefix="t", tier_region="us-east-1", tier_scan_interval_s=0.02, tier_retry_max_s=0.2,
    )


def main() -> None:
    data_dir, endpoint, bucket, first = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = MessageStore(config(data_dir, endpoint, bucket))
    store.start()
    store.tier = tier = TierService(store)
    tier.start()
    tier.uploader.wait_process(120)  # uploads run from the first roll on, as in a broker running a while
    os.write(1, b"READY\n")
    seq = first
    while True:
        store.put(Message(TOPIC, body(seq), queue_id=seq % 2, keys=(f"s{seq}",)))
        os.write(1, b"ACK %d\n" % seq)
        seq += 1
        if seq % 20 == 0:  # about 2k puts/s: segments roll every ~0.1 s, uploads keep up
            time.sleep(0.01)


if __name__ == "__main__":
    main()
