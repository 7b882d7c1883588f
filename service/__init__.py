"""The outrig server: `outrig serve`, or `OutrigServer(config)` from Python.

Layers, outermost first: server (grpc.aio, health, reflection) -> servicer (protobuf <-> engine
objects, errors -> status codes) -> backend (where spaces live) -> engine (pure matching).
"""
