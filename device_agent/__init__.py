"""kiln-agent: registers devices with a tracker, caches artifacts, runs and times them in a sandbox.

Imports only `protos` of ours (plus grpc, protobuf, numpy and the standard library): an agent runs on
small boards.
"""
