"""The postgres backend: a tier of outrig servers on one PostgreSQL database, each space served
from memory by one of them, its owner, and recorded in the database (`outrig serve --backend
postgres --dsn ...`, docs/postgres.md).

`PostgresBackend` (backend.py) is the memory backend (backends/memory) serving the spaces this
server owns; ownership, its claims, renewals and the tier's servers (ownership.py); the fenced
group-commit journal (journal.py); loading a space a server has claimed (loading.py); dead letters
for a dead-letter space another server owns (dead_letters.py); the schema and its migrations
(schema.py).
"""
