"""Where the tier's objects live, and the manifest that makes a segment's objects count.

Keys, under the configured prefix and the store's id (a store id names one
commitlog, so two brokers sharing a bucket never mix)::

    <store_id>/segment/<base>       the sealed segment file, as it is on disk, then (``inline``
                                    manifests) its index and keys objects' bytes
    <store_id>/index/<base>         the queue entries pointing into it (``segment_index``)
    <store_id>/keys/<base>          its keys and client ids, hashed and sorted (``key_index``)
    <store_id>/manifest/<base>      JSON, written last: the segment is in the tier
    <store_id>/tmp/...              uploads in progress; swept at start

Why the index and keys go inside the segment object (manifest version 3, ``inline``):
each request costs the uploader about 2 ms of botocore CPU whatever its size (and
the object store its own), so one object and the manifest, two requests per
segment, cost about a third less than four (bench/RESULTS.md, tier). Readers find
them by ``Manifest.where``; a manifest written before (version 2) names separate
objects, and a segment too large to go up from memory (``object_store``) still
gets them.

``<base>`` is the segment's first commitlog offset in 20 digits, as local segment
files are named. Data objects are immutable: a segment is uploaded once, and an
upload repeated after a crash writes the same bytes. Nothing counts as uploaded
until its manifest exists, and the manifest is written only after its data
objects are complete (each complete on arrival, see ``object_store``), so a crash
at any point leaves either a whole segment in the tier or no manifest: a reader
that starts from manifests can never take a partial object for data. Expiry
deletes the manifest first for the same reason.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..consume_queue import ENTRY_SIZE as CLASSIC_ENTRY_SIZE


def segment_key(store_id: str, base: int) -> str:
    return f"{store_id}/segment/{base:020d}"


def index_key(store_id: str, base: int) -> str:
    return f"{store_id}/index/{base:020d}"


def keys_key(store_id: str, base: int) -> str:
    return f"{store_id}/keys/{base:020d}"


def manifest_key(store_id: str, base: int) -> str:
    return f"{store_id}/manifest/{base:020d}"


def manifest_dir(store_id: str) -> str:
    return f"{store_id}/manifest/"


def tmp_dir(store_id: str) -> str:
    return f"{store_id}/tmp"


def base_of(name: str) -> int | None:
    """The segment base a manifest's name ends with, or None for a name that is not one."""
    tail = name.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() and len(tail) == 20 else None


@dataclass
class Manifest:
    """What the tier holds of one segment; its presence is the upload's confirmation."""

    base: int  # commitlog offset of the segment's first byte
    length: int  # [base, base + length) holds every record of the segment
    size: int  # bytes of the segment object (the whole segment file)
    sha256: str  # of the segment object
    index_length: int  # bytes of the index object
    first_ts: int  # store timestamps (ms) of the segment's first and last records
    last_ts: int
    # [topic, queue id, first queue offset, end queue offset, position of the first entry in
    # the index object, entry size] of every queue with entries here: entry size 20 for a
    # classic queue (one entry per offset), 32 for a batch topic's (one per record,
    # ``batch_queue.ENTRY``); a manifest from before batch topics has no size (20)
    queues: list[list] = field(default_factory=list)
    # bytes of the keys object (``key_index``); 0: none (a manifest written before it existed,
    # or a segment with no key and no client id)
    keys_length: int = 0
    # the index and keys objects follow the segment's ``size`` bytes in the segment object
    # (version 3), rather than being objects of their own (version 2, and any large segment)
    inline: bool = False
    version: int = 3

    def where(self, store_id: str, kind: str) -> tuple[str, int, int]:
        """(object name, where the bytes start in it, their length) of the segment's ``kind``:
        "segment", "index" or "keys"."""
        if kind == "segment":
            return segment_key(store_id, self.base), 0, self.size
        if kind == "index":
            if self.inline:
                return segment_key(store_id, self.base), self.size, self.index_length
            return index_key(store_id, self.base), 0, self.index_length
        if kind == "keys":
            if self.inline:
                return segment_key(store_id, self.base), self.size + self.index_length, self.keys_length
            return keys_key(store_id, self.base), 0, self.keys_length
        raise ValueError(f"no {kind!r} in a tier segment")

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Manifest":
        raw = json.loads(data)
        m = cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})
        m.queues = [q if len(q) > 5 else [*q, CLASSIC_ENTRY_SIZE] for q in m.queues]
        return m
