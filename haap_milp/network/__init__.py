"""Measured networks: bandwidth-vs-message-size curves per link class, their importers and their pricing.

* ``spec``: the description (``MeasuredNetwork`` of ``MeasuredLink``); ``ClusterSpec.network`` holds one.
* ``sailor``, ``nccl_tests``: importers (Sailor's fitted-curve JSON; nccl-tests' ``*_perf`` output).
* ``merge``: read a network file and attach it to a cluster (checks the GPU types and islands it names).
* ``pricing``: the link one collective gets at its real message size and sender count.

This package's ``__init__`` imports nothing: ``specs/cluster.py`` imports ``network.spec`` and must not see a cycle.
"""
