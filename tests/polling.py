"""Polling with a bound: how the tests wait for what happens in another process or thread.

No timing assertion: a test waits until the condition holds and fails only when it never
does within a bound far above what the slowest shared CI machine needs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition",
             interval: float = 0.1) -> Any:
    """Call ``check`` until it returns a truthy value (returned); AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = check()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
