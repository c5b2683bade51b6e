"""The MQTT door: MQTT 3.1, 3.1.1 and 5.0 (TCP and WebSocket) in front of the MessagingProcessor.

Modules, bottom up:

- ``codec``: sans-io packet codec (bytes in, packets out) -- hand-written, see its docstring.
- ``topics``: topic names and filters, the unified-topic mapping, the topic-filter trie.
- ``session``: what outlives a connection (subscriptions, LMQ cursors, in-flight windows).
- ``broker``: the protocol state machine per connection and the routing/delivery logic,
  talking to the store only through the processor.
- ``server``: the asyncio TCP and WebSocket listeners (``MQTTDoor``, ``MQTTWebSocketDoor``).
"""
