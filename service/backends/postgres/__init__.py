"""The PostgreSQL backend: several outrig servers share each space through one database
(`outrig serve --backend postgres --dsn ...`, docs/postgres.md).

`PostgresBackend` and its operations (backend.py); the SQL they share, the template condition and
the quota counts (queries.py); the LISTEN/NOTIFY channel that wakes parked calls and feeds notify
streams across servers (listener.py); lease expiry (reaper.py); request ids (idempotency.py);
notify registrations and their streams (notify.py); the schema and its migrations (schema.py).
"""
