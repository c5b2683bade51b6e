"""Tiered storage: sealed commitlog segments, and what finds messages in them, on object storage.

Why a package of its own: the tier is the one part of the store that talks to the
network (an S3-compatible object store through boto3), runs its own worker thread
and may be down while the store keeps writing. The store knows it only through a
seam (``MessageStore.tier``: ``may_delete(segment)``), so the local write path
never waits on it. Modules, one concept each: ``object_store`` (the client),
``layout`` (key names and the manifest), ``segment_index`` (the queue entries and
keys of one segment), ``uploader`` (the upload worker: what to upload, retries,
confirmed uploads), ``upload_process`` (the child process that uploads, off the
broker's GIL), ``expiry`` (tier
retention) and ``service`` (what the store and the broker hold). See README,
"Tiered storage".
"""

from __future__ import annotations

from .service import TierService

__all__ = ["TierService"]
