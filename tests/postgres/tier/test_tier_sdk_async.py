"""tests/integration/test_sdk_async.py through a tier of two postgres servers, forwarded and direct
(the `server` of ./conftest.py)."""

from ...integration.test_sdk_async import *  # noqa: F403  # the suite, collected here again
