"""The S3-compatible object store, as the tier needs it: complete objects, ranged reads, listing.

Why a wrapper round boto3: the tier's rule that an object is visible only once
whole lives here. A large object is uploaded to a temporary key (boto3's managed
transfer, multipart for big files) and copied to its final key, then the
temporary key is deleted; a crash in between leaves only a ``tmp/`` key, which no
reader looks at. Small objects go up in one PUT, which S3 makes visible whole or
not at all. Checksums are calculated and validated only when an operation
requires them: with boto3's newer defaults ranged GETs fail against several
S3 implementations. Bodies are not hashed for the signature (``UNSIGNED-PAYLOAD``:
over http botocore otherwise reads and hashes every body once more); instead each
PUT names its body's SHA-256 in ``x-amz-checksum-sha256``, a signed header, which
the caller computed anyway for a segment (the manifest's digest), so AWS S3 still
refuses a body that does not match it, at no extra cost (moto and ``rclone serve
s3`` accept the header without checking it). Credentials come from boto3's usual chain (environment
variables, ``~/.aws`` files, instance roles). boto3 is imported here only, so
the store runs without it while the tier is off.
"""

from __future__ import annotations

import base64
import hashlib
import io
import uuid
from dataclasses import dataclass
from typing import IO, Callable, Iterator

from ..errors import ConfigurationError


_COPY_OBJECT_MAX = 5 << 30  # the largest object one CopyObject may copy
_ONE_PUT_MAX = 64 << 20  # larger objects go up in parts (boto3's managed transfer), smaller ones from memory


@dataclass(frozen=True)
class ObjectStoreSettings:
    """What names an object store and how it is spoken to: enough to open the same one in
    another process (the upload process, ``upload_process``); credentials are not here, they
    come from boto3's chain in each process (the child inherits the broker's environment)."""

    bucket: str
    prefix: str = ""
    endpoint: str = ""
    region: str = ""
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    direct_put_max: int = _ONE_PUT_MAX


class ObjectStore:
    """One bucket and key prefix on an S3-compatible endpoint."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint: str = "",
        region: str = "",
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        max_connections: int = 10,
        direct_put_max: int = _ONE_PUT_MAX,
    ) -> None:
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError, ClientError
        except ImportError:
            raise ConfigurationError("tier_enabled needs boto3: pip install 'unimq[tier]'") from None

        # What a call raises when the store is down, slow or refuses: the uploader retries these.
        self.errors: tuple[type[BaseException], ...] = (BotoCoreError, ClientError, OSError)
        self.settings = ObjectStoreSettings(bucket, prefix, endpoint, region, connect_timeout_s, read_timeout_s, direct_put_max)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.direct_put_max = direct_put_max  # see put_complete (tests: 0, every object by a temporary key)
        config = Config(
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"max_attempts": 2, "mode": "standard"},  # the uploader backs off itself
            # one kept-alive connection per thread that calls at once (uploader, read workers,
            # read-ahead): fewer and a busy reader would open and drop a connection per GET
            max_pool_connections=max_connections,
            # no SHA-256 of the body in the signature: the PUTs carry their own (ChecksumSHA256)
            s3={"payload_signing_enabled": False},
        )
        self.client = boto3.client(
            "s3", endpoint_url=endpoint or None, region_name=region or None, config=config
        )

    def key(self, name: str) -> str:
        """The full key of ``name`` under the prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def in_one_put(self, size: int) -> bool:
        """An object of ``size`` bytes goes up in one PUT from memory (larger: in parts, from the file)."""
        return size <= _ONE_PUT_MAX

    def put_small(self, name: str, data: bytes) -> None:
        """One PUT: visible whole or not at all (manifests, indexes)."""
        self._put(self.key(name), bytearray(data), hashlib.sha256(data).digest())

    def _put(self, key: str, body: bytearray, sha256: bytes) -> None:
        """One PUT of ``body`` whose SHA-256 is ``sha256`` (the server checks it, see above).

        A ``bytearray``, not ``bytes``: botocore wraps ``bytes`` in a file object, and for a
        file object it sends ``Expect: 100-continue``, waits for the server's interim answer
        and parses it, then sends the body in 16 KiB writes; a bytearray goes out in one
        write after the headers, with no interim answer (measured: ``bench/RESULTS.md``,
        branch tier3)."""
        self.client.put_object(
            Bucket=self.bucket, Key=key, Body=body, ContentLength=len(body),
            ChecksumSHA256=base64.b64encode(sha256).decode(),
        )

    def put_complete(
        self, name: str, fileobj: IO[bytes] | bytearray, size: int, tmp_dir: str, sha256: bytes,
        between: Callable[[], None] | None = None,
    ) -> None:
        """Upload ``size`` bytes of ``fileobj`` (or the bytes already read into a bytearray), whose
        SHA-256 is ``sha256``, so that ``name`` appears only complete.

        Up to ``direct_put_max`` bytes: one PUT of the bytes straight to ``name``, visible whole
        or not at all. Larger: temp key, copy, delete temp (a multipart upload's parts would be
        visible under ``name`` one by one); ``between`` (tests) is called after the temporary
        upload, before the copy. Either way the caller's manifest, written after this returns,
        is what makes the object count: an attempt a crash cut leaves an object no manifest
        names, replaced by the next attempt.

        The copy is one CopyObject up to S3's 5 GiB limit for it: boto3's managed copy turns
        anything over 8 MiB into a multipart UploadPartCopy, which some S3 implementations
        (rclone's ``serve s3``) answer without the part's ETag, failing every large copy.
        """
        tmp = self.key(f"{tmp_dir}/{name.replace('/', '_')}.{uuid.uuid4().hex}")
        if size <= _ONE_PUT_MAX:  # one PUT of the bytes read at once: no transfer manager threads
            # Not streamed from the file: the HTTP client sends a file in 16 KiB writes, and after
            # each one this thread waits for the GIL, up to the 5 ms switch interval while a put
            # or a read holds it; one write of the whole object waits once.
            body = fileobj if isinstance(fileobj, bytearray) else bytearray(fileobj.read(size))
            if size <= self.direct_put_max:  # no copy: half the requests, the server writes it once
                self._put(self.key(name), body, sha256)
                return
            self._put(tmp, body, sha256)
        else:  # parts, in parallel, each retried on its own
            self.client.upload_fileobj(io.BytesIO(fileobj) if isinstance(fileobj, bytearray) else fileobj, self.bucket, tmp)
        try:
            if between is not None:
                between()
            source = {"Bucket": self.bucket, "Key": tmp}
            if size <= _COPY_OBJECT_MAX:
                self.client.copy_object(CopySource=source, Bucket=self.bucket, Key=self.key(name))
            else:
                self.client.copy(source, self.bucket, self.key(name))
        finally:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=tmp)
            except self.errors:
                pass  # left for the sweep of tmp/ at the next start

    def get(self, name: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()

    def get_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object (one ranged GET)."""
        r = self.client.get_object(Bucket=self.bucket, Key=self.key(name), Range=f"bytes={start}-{end - 1}")
        return r["Body"].read()

    def names(self, under: str) -> Iterator[str]:
        """Names (without the prefix) of every object under ``under``."""
        strip = len(self.key(""))
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.key(under))
        for page in pages:
            for obj in page.get("Contents", ()):
                yield obj["Key"][strip:]

    def delete(self, names: list[str]) -> None:
        for i in range(0, len(names), 1000):  # DeleteObjects takes at most 1000 keys
            chunk = names[i : i + 1000]
            self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": self.key(n)} for n in chunk], "Quiet": True}
            )

