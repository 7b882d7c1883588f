"""The Locust entry point of outrig's campaigns: ``locust -f loadtest/locustfile.py --host HOST:PORT``.

Options (see ``--help``): ``--campaign stress|stress-with-shutdown|random|at-least-once`` and the campaign's
parameters, named after StressTestWithShutdown's (``--num-entries``, ``--num-writers``, ...).
Locust's own options work as usual, distributed runs (``--master``, ``--worker``) included.
`outrig stress` runs a whole campaign headless, with a server it starts, kills and restarts.

gRPC's gevent support is initialised before the SDK makes a channel, as Locust's gRPC example
does, so that blocking calls yield to the other users instead of stopping the process.
"""

import os

# Before gRPC loads: gevent's subprocess forks with os.fork, and gRPC's fork handlers would restart
# its poller in the child (--kill-command, --restart-command), which aborts there (grpc/grpc#43157).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()

from outrig.loadtest.campaign import CampaignShape, JobWorker, JobWriter, MixUser, Reader, Writer  # noqa: E402

__all__ = ["CampaignShape", "JobWorker", "JobWriter", "MixUser", "Reader", "Writer"]
