"""The AMQP 0-9-1 door: RabbitMQ's dialect in front of the MessagingProcessor.

Modules, one concept each, bottom up:

- ``codec``: sans-io frame codec (bytes in, events out; hand-written hot paths).
- ``errors``: ``AmqpError``, a reply code and the method it answers.
- ``state``: the connection's and each channel's protocol state, sans-io, as explicit transitions.
- ``handshake``: the handshake's decisions (server properties, SASL login, tuning).
- ``mapping``: an AMQP publish as a unified message and back; ``routing``: exchanges,
  bindings, publish-time routing; ``settings``: the door's knobs.
- ``durable``: the kv records of exchanges, queues, bindings and cursors.
- ``lease`` / ``priority_buffer``: a queue's messages and its ready buffers.
- ``queue_state``: one queue (consumers, pump, spill to its LMQ through
  ``gateway.lmq_reader``, durable cursor); ``vhost``: a vhost's exchanges and queues.
- ``broker``: what every connection shares (declaring, persisting, dead-lettering,
  x-expires, the cross-door router).
- ``consumer`` / ``channel``: credit; deliveries and acknowledgements per channel.
- ``publisher``: a connection's publishes from arrival to confirm; ``methods``: one
  handler per channel method.
- ``connection``: one network connection, a thin loop around codec and state;
  ``server``: the listener, the disk alarm, the clean stop.
"""
