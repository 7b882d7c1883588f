"""The embedded backend's record: a SQLite database in the data dir (schema, group commit,
recovery, backup and check)."""
