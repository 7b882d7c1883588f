"""The Locust entry point of outrig's campaigns: ``locust -f loadtest/locustfile.py --host HOST:PORT``.

Options (see ``--help``): ``--campaign stress|stress-with-shutdown|random`` and the campaign's
parameters, named after StressTestWithShutdown's (``--num-entries``, ``--num-writers``, ...).
Locust's own options work as usual, distributed runs (``--master``, ``--worker``) included.
`outrig stress` runs a whole campaign headless, with a server it starts, kills and restarts.

gRPC's gevent support is initialised before the SDK makes a channel, as Locust's gRPC example
does, so that blocking calls yield to the other users instead of stopping the process.
"""

from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()

from outrig.loadtest.campaign import CampaignShape, MixUser, Reader, Writer  # noqa: E402

__all__ = ["CampaignShape", "MixUser", "Reader", "Writer"]
