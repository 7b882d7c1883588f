"""Every error the outrig service raises on purpose, under one root.

    SpaceError
    ├── InvalidArgumentError      a request is malformed      -> INVALID_ARGUMENT
    ├── LeaseNotFoundError        unknown or expired lease    -> NOT_FOUND
    ├── QuotaExceededError        a quota or limit is reached -> RESOURCE_EXHAUSTED
    ├── TypeConflictError         a type redeclared otherwise -> FAILED_PRECONDITION
    ├── ShuttingDownError         the server is stopping      -> UNAVAILABLE
    └── ConfigError               bad start-up configuration  (the CLI exits 2)

The engine raises these; the gRPC servicer maps them to status codes through one table
(outrig.service.servicer.STATUS_BY_ERROR). Messages name the field or limit at fault.
"""

from __future__ import annotations


class SpaceError(Exception):
    """Root of the service's errors."""


class InvalidArgumentError(SpaceError):
    """A request is malformed: a bad value, name, duration or shape."""


class LeaseNotFoundError(SpaceError):
    """A renew or cancel named a lease that is unknown, cancelled or expired."""


class QuotaExceededError(SpaceError):
    """A space quota (entries, bytes) or a server limit would be exceeded."""


class TypeConflictError(SpaceError):
    """An entry type was declared with supertypes other than those it already has."""


class ShuttingDownError(SpaceError):
    """The server is stopping and takes no new work."""


class ConfigError(SpaceError):
    """The server's configuration (flags, environment, file) is invalid."""
