"""`unimq tier status`: what the tiered storage holds of a store, and what waits for upload.

Why in the application and not a door: it needs the same settings a broker is
started with (the ``[store]`` table's ``tier_*`` knobs and ``data_dir``: the
config file, ``--data-dir`` and ``--set``), and it reads the bucket and the data
directory directly (``core_broker.tier.status``), so it answers whether the
broker runs or not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .settings import load_settings


def add_parser(sub: Any) -> None:
    tier = sub.add_parser("tier", help="tiered storage: status (uploaded, pending, oldest readable offsets)",
                          description="Tiered storage on an S3-compatible object store (README, Tiered storage).")
    actions = tier.add_subparsers(dest="tier_command", metavar="ACTION")
    actions.required = True
    status = actions.add_parser("status", help="uploaded and pending segments, oldest readable offset per queue")
    status.add_argument("--config", type=Path, metavar="FILE", help="the broker's TOML config file")
    status.add_argument("--data-dir", dest="data_dir", type=Path, metavar="DIR", help="the store's folder")
    status.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="set a knob, e.g. store.tier_bucket=archive (as for `unimq up`)")
    status.add_argument("--json", action="store_true", help="print one JSON object")


def format_report(r: dict[str, Any]) -> str:
    def mib(n: int) -> str:
        return f"{n / (1 << 20):.1f} MiB"

    lines = [
        f"tier s3://{r['bucket']}/{r['prefix']}/{r['store_id']}/",
        f"  uploaded: {r['uploaded_segments']} segment(s), {mib(r['uploaded_bytes'])}, "
        f"commitlog offsets {r['tier_first_offset']} to {r['tier_end_offset']}",
        f"  pending:  {r['pending_segments']} sealed segment(s), {mib(r['pending_bytes'])}",
        f"  local:    {r['local_segments']} segment(s) from commitlog offset {r['local_first_offset']}",
        "  oldest readable offset per queue (tier / local):",
    ]
    for q in r["queues"]:
        lines.append(f"    {q['topic']} {q['queue']}: {q['oldest_readable']} "
                     f"({'-' if q['oldest_in_tier'] is None else q['oldest_in_tier']} / "
                     f"{'-' if q['oldest_local'] is None else q['oldest_local']})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from .cli import _parse_sets

    try:
        overrides: dict[str, object] = {"data_dir": args.data_dir}
        overrides.update(_parse_sets(args.sets))
        cfg = load_settings(args.config, overrides).store
        if not cfg.tier_bucket:
            raise ValueError("no tier_bucket configured (--config FILE or --set store.tier_bucket=NAME)")
        from core_broker.tier.status import tier_report

        report = tier_report(cfg)
    except ImportError as exc:
        print(f"unimq: error: the tier needs boto3 (pip install 'unimq[tier]'): {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"unimq: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the object store unreachable, refused credentials, no such bucket
        print(f"unimq: error: cannot read the tier: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report) if args.json else format_report(report))
    return 0
