"""Locust stress campaigns against a real outrig server (StressTestWithShutdown, a random mix).

The campaigns land with the load-test issue; this package reserves the `outrig.loadtest` name.
"""
