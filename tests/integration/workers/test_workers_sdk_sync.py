"""tests/integration/test_sdk_sync.py through `outrig serve --workers 2`, forwarded and direct
(the `server` of ./conftest.py)."""

from ..test_sdk_sync import *  # noqa: F403  # the suite, collected here again
