"""tests/integration/test_sdk_sync.py through a tier of two postgres servers, forwarded and direct
(the `server` of ./conftest.py)."""

from ...integration.test_sdk_sync import *  # noqa: F403  # the suite, collected here again
