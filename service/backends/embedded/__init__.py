"""The embedded backend: the memory backend (backends/memory) recorded in SQLite in the data dir
(backend.py), with group commit and recovery (store/)."""
