"""Fabric's pure core: hostlists, fabric descriptions, their parsers and writers, the levels of
a fabric, its in-memory topology, generators and the locality vocabulary.

Plain data in, plain data out: nothing here imports Django, so the placement engine, the
simulator, the benchmarks and the node agent share it with the server.
"""
