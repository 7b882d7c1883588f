"""The memory backend: each space served from the pure engine in this process (backend.py),
optionally recorded by a group-commit journal (journal.py's protocol, driven by recorder.py),
retried requests answered once (idempotency.py), notify registrations as queues
(subscription.py). The embedded backend records it in SQLite, the postgres backend in PostgreSQL."""
