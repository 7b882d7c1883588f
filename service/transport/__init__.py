"""The gRPC adapter: the only room of the server that imports grpc (with security/, which reads a
call's credentials, and cli/health, a gRPC client).

`server` runs a grpc.aio server with the Space service, health checking and reflection;
`servicer` translates each call between protobuf and the backend, through the security guard;
`mux` serves the Mux stream on the same code; `handlers` registers their methods, with request
and reply (de)serializers of their own; `metrics` exposes Prometheus metrics.
"""
