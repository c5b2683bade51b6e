"""The AMQP door's protocol error: a reply code, its text, the method it answers.

Why one module: every part of the door (the connection's state machine, channels,
queues, the broker) refuses things with AMQP 0-9-1's reply codes, and the
connection turns each refusal into a Channel.Close or, for a hard error, a
Connection.Close naming the class and method that caused it.
"""

from __future__ import annotations

from typing import Any

from . import codec

__all__ = ["AmqpError", "method_ids"]


class AmqpError(Exception):
    """A protocol error: ``hard`` ones close the connection, the others the channel."""

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0, hard: bool = False) -> None:
        name = codec.REPLY_TEXT.get(code, "ERROR")
        super().__init__(f"{name} - {text}")
        self.code = code
        self.text = f"{name} - {text}"[:255]
        self.class_id = class_id
        self.method_id = method_id
        self.hard = hard or code in (501, 502, 503, 504, 505, 530, 540, 541)



def method_ids(m: Any) -> tuple[int, int]:
    """(class id, method id) of a pamqp method, for the Close that answers it."""
    return m.index >> 16, m.index & 0xFFFF
