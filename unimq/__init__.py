"""unimq, the application: the command line, the process roles, the settings, the wiring.

This package sits above every other: it is the only one that knows every door
(``adapters/*``, ``gateway/grpc``) and every role (nameserver, broker, gateway,
merged), builds them from the settings and runs them. Nothing below imports it.

- :mod:`unimq.cli`: the ``unimq`` command (``python -m unimq`` works too);
- :mod:`unimq.settings`: the settings, composed from each door's own dataclass;
- :mod:`unimq.roles`: one module per process role, each starting its core;
- :mod:`unimq.doors`: which doors a process opens, wired to its processor;
- :mod:`unimq.process`: the process starter (start in order, announce, stop in reverse);
- :mod:`unimq.local_cluster`: a separated deployment as real processes on one machine.
"""
