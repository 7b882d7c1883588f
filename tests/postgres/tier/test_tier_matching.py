"""tests/integration/test_matching.py (matchers and order_by, sync and async) through a tier of two
postgres servers, forwarded and direct (the `server` of ./conftest.py): a forwarded call carries
its matchers and order as the bytes it arrived as."""

from ...integration.test_matching import *  # noqa: F403  # the suite, collected here again
