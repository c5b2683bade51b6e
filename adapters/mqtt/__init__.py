"""The MQTT door: MQTT 3.1, 3.1.1 and 5.0 (TCP, TLS and WebSocket) in front of the MessagingProcessor.

Modules, one concept each, bottom up:

- ``codec``: sans-io packet codec (bytes in, packets out) -- hand-written, see its docstring.
- ``state``: the connection's protocol state, sans-io, as an explicit transition table.
- ``topics``: topic names and filters, the topic-filter trie.
- ``mapping``: an MQTT PUBLISH as a unified message and back (``Outgoing``).
- ``session``: what outlives a connection (subscriptions, LMQ lanes, in-flight windows).
- ``config``: the door's knobs.
- ``acl`` / ``passwords``: topic rights (Mosquitto ACL files) / who may connect.
- ``routing``: subscriptions -> dispatch plans; ``retained``: retained messages;
  ``session_store``: persistent sessions; ``wills``: wills.
- ``delivery``: in-flight windows and QoS 1/2 delivery from the sessions' LMQs (through
  ``gateway.lmq_reader``); ``shared``: shared subscriptions' pop/ack delivery.
- ``connection``: one network connection, a thin loop around codec and state; ``deadlines``: the
  CONNECT deadline of connections yet to send one (one timer for the door).
- ``broker``: the door tying them (CONNECT, SUBSCRIBE, publishing); ``xroute``: the router seam
  (messages other doors send on MQTT topics).
- Several gateways: ``fleet`` / ``copies`` (persistent sessions, routing copies), ``tail``
  (clean sessions and QoS 0: other gateways' messages read from the store topics),
  ``fleet_share`` (shared subscriptions' groups across the fleet).
- ``sys_topics``: ``$SYS`` statistics; ``server``: the asyncio listeners.
"""
