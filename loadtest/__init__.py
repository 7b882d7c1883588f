"""Locust stress campaigns against a real outrig server: StressTestWithShutdown, the same without
the kill, and a random mix. `outrig stress` runs one headless; ``locust -f loadtest/locustfile.py``
runs them under Locust's own flags. See docs/loadtest.md.

Importing this package imports neither Locust nor gevent; `outrig.loadtest.locustfile` and
`outrig.loadtest.runner` do.
"""
