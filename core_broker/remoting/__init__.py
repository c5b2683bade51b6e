"""unimq's internal RPC: brokers, nameservers and gateways talking to each other.

A deliberately small protocol of our own rather than gRPC: every frame is a
length-prefixed msgpack array, calls are multiplexed by id on one TCP
connection; the data path's batches travel as blocks of plain rows
(``rows.py``, ``wire.py``) packed by msgpack's C code. In CPython
this costs a few microseconds per call where grpc.aio costs around a hundred,
which matters because a separated deployment puts one RPC behind every send,
pop and ack. The codec is sans-io (``codec.py``); client and server are thin
asyncio loops around it.
"""
