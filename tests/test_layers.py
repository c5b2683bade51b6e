"""The house's layering, read from every module's imports (stdlib ``ast``), so it stays true.

The layers, top to bottom; a module may import only from its own room or from a
lower layer, so imports point downward and no two packages import each other:

4. ``unimq``: the application (CLI, process roles, settings, wiring of doors to a
   processor). The only room that knows every door and every role.
3. The doors: ``adapters.mqtt``, ``adapters.amqp``, ``adapters.cloudevents`` and
   ``gateway.grpc`` (a door that lives in ``gateway/`` for historical reasons);
   beside them ``spark_ingest``, a client of the gateway's network API. Rooms of
   one layer never import each other: no door imports another door, no door
   imports ``spark_ingest`` and ``spark_ingest`` imports no door.
2. ``gateway`` (everything in it but ``gateway.grpc``): the processor API, the
   processor, what every door needs (``gateway.door``, ``gateway.naming``,
   ``gateway.lmq_reader``).
1. ``nameserver``: routes under leases; it talks over ``core_broker.remoting``, the
   RPC transport brokers and nameservers share, so it sits above ``core_broker``.
0. ``core_broker``: the domain model and the store; imports nothing above it.

``spark_ingest`` is a client: it reads topics over the network and must not
import the store (``core_broker``) or the doors. From the project it may import
only :data:`SPARK_INGEST_MAY_IMPORT`: the cross-protocol naming conventions
(which property holds the MQTT topic) and the Arrow schema of the gateway's
Arrow pages (part of the gateway's network API, defined once where it is
served; a leaf module of pyarrow, numpy and the naming rules).

:data:`KNOWN` names the imports that break these rules today and are being
fixed under issue 15 by other changes; each entry says which. When a fix lands,
:func:`test_known_exceptions_still_exist` fails until its entry is removed.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("unimq", "adapters", "gateway", "nameserver", "core_broker", "spark_ingest")
DOORS = ("adapters.mqtt", "adapters.amqp", "adapters.cloudevents", "gateway.grpc")
LAYER = {
    "unimq": 4,
    **{door: 3 for door in DOORS},
    "adapters": 3,
    "spark_ingest": 3,
    "gateway": 2,
    "nameserver": 1,
    "core_broker": 0,
}
SPARK_INGEST_MAY_IMPORT = ("gateway.naming", "gateway.arrow_schema")

#: (importing module, imported module or a prefix of it) -> why it is still allowed.
KNOWN: dict[tuple[str, str], str] = {}


def room(module: str) -> str:
    """The room a module belongs to: a door, or its top-level package."""
    for door in DOORS:
        if module == door or module.startswith(door + "."):
            return door
    return module.split(".")[0]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every project module ``path`` imports (absolute or relative, at any depth of the file)."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod when there is one.
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                if _is_module(candidate):
                    found.add(candidate)
                else:
                    found.add(target)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def _is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


MODULES = [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))]
#: (importing module, imported module) for every import between two rooms.
EDGES = [
    (_module_name(path), target)
    for path in MODULES
    for target in sorted(_imports(path))
    if room(target) != room(_module_name(path))
]


def _known(src: str, target: str) -> bool:
    return any(src == k_src and (target == k_dst or target.startswith(k_dst + ".")) for k_src, k_dst in KNOWN)


def _report(bad: list[tuple[str, str]]) -> str:
    return "\n".join(f"  {src} -> {target}" for src, target in bad)


def test_every_package_is_read() -> None:
    """The rules are only as good as the files they read: every package has modules, unimq included."""
    seen = {_module_name(path).split(".")[0] for path in MODULES}
    assert seen == set(PACKAGES)


def test_imports_point_downward() -> None:
    bad = [(s, t) for s, t in EDGES if LAYER[room(t)] >= LAYER[room(s)] and not _known(s, t)]
    assert not bad, "imports that point up or sideways (see this file's docstring for the layers):\n" + _report(bad)


def test_no_two_packages_import_each_other() -> None:
    """Known exceptions included: none of them may close a loop between two packages."""
    uses: dict[str, set[str]] = defaultdict(set)
    for src, target in EDGES:
        a, b = src.split(".")[0], target.split(".")[0]
        if a != b:
            uses[a].add(b)
    loops = sorted({tuple(sorted((a, b))) for a in uses for b in uses[a] if a in uses.get(b, set())})
    assert not loops, f"packages importing each other: {loops}\n" + _report(
        [(s, t) for s, t in EDGES if tuple(sorted((s.split(".")[0], t.split(".")[0]))) in loops])


def test_no_door_imports_another_door() -> None:
    bad = [(s, t) for s, t in EDGES if room(s) in DOORS and room(t) in DOORS and not _known(s, t)]
    assert not bad, "doors share through gateway/, never by importing each other:\n" + _report(bad)


def test_spark_ingest_imports_only_what_a_client_may() -> None:
    allowed = SPARK_INGEST_MAY_IMPORT
    bad = [
        (s, t) for s, t in EDGES
        if room(s) == "spark_ingest" and t not in allowed and not any(t.startswith(a + ".") for a in allowed)
        and not _known(s, t)
    ]
    assert not bad, f"spark_ingest is a client; from the project it may import only {allowed}:\n" + _report(bad)


@pytest.mark.parametrize("entry", sorted(KNOWN), ids=lambda e: f"{e[0]}->{e[1]}")
def test_known_exceptions_still_exist(entry: tuple[str, str]) -> None:
    src, target = entry
    assert any(s == src and (t == target or t.startswith(target + ".")) for s, t in EDGES), (
        f"{src} no longer imports {target} ({KNOWN[entry]}): remove its entry from KNOWN in {Path(__file__).name}"
    )
