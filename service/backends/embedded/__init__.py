"""The embedded backend: each space served from the pure engine in this process (backend.py),
its changes recorded in SQLite with group commit (recorder.py, store/), retried requests answered
once (idempotency.py), notify registrations as queues (subscription.py)."""
