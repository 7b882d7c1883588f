"""tests/integration/test_transactions.py through `outrig serve --workers 2`, forwarded and
direct (the `server` of ./conftest.py)."""

from ..test_transactions import *  # noqa: F403  # the suite, collected here again
