"""Replicated broker groups: a master streams its commitlog to replicas (issue 16).

Modules: ``epoch_file`` (the (epoch, start offset) history beside the commitlog and
the common point of two histories), ``in_sync`` (the master's view of its
replicas: acknowledgement waits and in-sync set changes), ``follower`` (a
replica's copy loop), ``service`` (roles, the RPC the replicas call, the
condition installed in the store's DurabilityPolicy).
"""
