"""tests/integration/test_transactions.py through a tier of two postgres servers, forwarded and direct
(the `server` of ./conftest.py)."""

from ...integration.test_transactions import *  # noqa: F403  # the suite, collected here again
