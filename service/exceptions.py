"""Every error the outrig service raises on purpose, under one root.

    SpaceError
    ├── InvalidArgumentError      a request is malformed      -> INVALID_ARGUMENT
    │   ├── RoutingValueError     an entry of a partitioned space without its routing value
    │   └── InvalidCursorError    a change log position ahead of the log's head
    ├── LeaseNotFoundError        unknown or expired lease    -> NOT_FOUND
    │   └── TransactionNotFoundError unknown or ended transaction (its id is a lease id)
    ├── QuotaExceededError        a quota or limit is reached -> RESOURCE_EXHAUSTED
    ├── UnsupportedError          not provided by this backend (yet) -> UNIMPLEMENTED
    ├── TypeConflictError         a type redeclared otherwise -> FAILED_PRECONDITION
    ├── TransactionAbortedError   commit of an aborted transaction -> FAILED_PRECONDITION
    ├── CrossPartitionError       a transaction touching a second partition -> FAILED_PRECONDITION
    ├── DeliveryExpiredError      an ack/nack/extend of a delivery no longer pending -> FAILED_PRECONDITION
    ├── ShuttingDownError         the server is stopping      -> UNAVAILABLE
    ├── RequestConflictError      a request id reused for another call -> FAILED_PRECONDITION
    ├── RegistrationBusyError     resuming a registration another stream holds -> FAILED_PRECONDITION
    ├── CompactedError            a change log position retention no longer holds -> OUT_OF_RANGE
    ├── SubscriptionBusyError     a durable subscription another stream reads -> FAILED_PRECONDITION
    ├── SubscriptionNotFoundError an unknown durable subscription -> NOT_FOUND
    ├── ChangesOffError           Changes of a space whose log is off (changes = false) -> FAILED_PRECONDITION
    ├── UnauthenticatedError      the caller is unknown (no, or a bad, credential) -> UNAUTHENTICATED
    ├── PermissionDeniedError     the caller may not do this -> PERMISSION_DENIED
    ├── StoreError                the data dir's store
    │   ├── StoreUnavailableError a change could not be made durable -> UNAVAILABLE
    │   ├── StoreLockedError      another server holds the data dir  (the CLI exits 2)
    │   └── IncompatibleStoreError not an outrig store of this format (the CLI exits 2)
    ├── ConfigError               bad start-up configuration  (the CLI exits 2)
    │   └── PolicyError           a policy file that cannot be used (on reload: the old one stays)
    └── ProcessTuningError        a process-wide setting left as it was (logged; the server runs on)

The engine raises these; the gRPC servicer maps them to status codes through one table
(outrig.service.transport.servicer.STATUS_BY_ERROR). Messages name the field or limit at fault, and quote
a client's text only through `excerpt`: a message travels back as gRPC metadata, which a client
refuses beyond its limit (8 KiB by default), so a 100,000-character name must not be echoed whole.
"""

from __future__ import annotations

#: The most characters of a client's text that a message quotes (`excerpt`).
EXCERPT_CHARACTERS = 64


def excerpt(text: str, limit: int = EXCERPT_CHARACTERS) -> str:
    """`text` quoted for a message: its repr when it has at most `limit` characters, else the
    repr of its first `limit`, an ellipsis, and how long it was: "'aaaa…' (100000 characters)"."""
    if len(text) <= limit:
        return repr(text)
    quoted = repr(text[:limit])
    return f"{quoted[:-1]}…{quoted[-1]} ({len(text)} characters)"


class SpaceError(Exception):
    """Root of the service's errors."""


class InvalidArgumentError(SpaceError):
    """A request is malformed: a bad value, name, duration or shape."""


class RoutingValueError(InvalidArgumentError):
    """An entry written to a partitioned space holds no value in the space's routing field."""


class InvalidCursorError(InvalidArgumentError):
    """A change log position (a cursor's, or an ack's) ahead of the log's head."""


class DeliveryExpiredError(SpaceError):
    """An Ack, Nack or Extend names a delivery that is no longer pending: acknowledged or returned
    already, past its deadline (the entry visible again, perhaps delivered to someone else since),
    its entry cancelled or expired, or never given. Nothing was changed."""


class CrossPartitionError(SpaceError):
    """A transaction of a partitioned space touched a partition other than its own, or a Begin
    named no routing value."""


class LeaseNotFoundError(SpaceError):
    """A renew or cancel named a lease that is unknown, cancelled or expired."""


class TransactionNotFoundError(LeaseNotFoundError):
    """The transaction is unknown, or has already committed, aborted or run out of lease."""


class TransactionAbortedError(SpaceError):
    """A commit of a transaction that has aborted (or an abort of one that has committed)."""


class UnsupportedError(SpaceError):
    """An operation this backend does not provide (yet)."""


class QuotaExceededError(SpaceError):
    """A space quota (entries, bytes) or a server limit would be exceeded."""


class TypeConflictError(SpaceError):
    """An entry type was declared with supertypes other than those it already has."""


class ShuttingDownError(SpaceError):
    """The server is stopping and takes no new work."""


class ConfigError(SpaceError):
    """The server's configuration (flags, environment, file) is invalid."""


class PolicyError(ConfigError):
    """A policy file is malformed: bad TOML, an unknown action, a resource that is no pattern."""


class UnauthenticatedError(SpaceError):
    """The caller could not be identified: no credential where one is required, or a bad one."""


class PermissionDeniedError(SpaceError):
    """An identified caller asked for something no grant of the policy allows."""


class RequestConflictError(SpaceError):
    """A request id was used again for a different operation or space."""


class RegistrationBusyError(SpaceError):
    """A notify registration to resume already has a stream attached."""


class CompactedError(SpaceError):
    """A change log position older than retention keeps, or of another epoch of the space's log
    (its log is gone): `oldest` is the oldest position still readable (the oldest held change's
    seq - 1) of the log's current `epoch`."""

    def __init__(self, message: str, *, epoch: int, oldest: int) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.oldest = oldest


class SubscriptionBusyError(SpaceError):
    """A durable subscription already has a stream attached (at most one at once)."""


class SubscriptionNotFoundError(SpaceError):
    """An ack or delete of a durable subscription the space does not have."""


class ChangesOffError(SpaceError):
    """Changes of a space whose change log is turned off (its setting `changes = false`)."""


class StoreError(SpaceError):
    """The store in the data dir cannot be used."""


class StoreUnavailableError(StoreError):
    """A change could not be made durable (full disk, failing fsync); nothing was acknowledged."""


class NotOwnerError(StoreUnavailableError):
    """This server does not own the space (any more, or not yet): the call acknowledged nothing.
    `owner` is the address of the server believed to own it ("" when unknown)."""

    def __init__(self, message: str, owner: str = "") -> None:
        super().__init__(message)
        self.owner = owner


class NoOtherServerError(SpaceError):
    """An operation of the tier (moving a space, draining a server) needs another live server."""


class StoreLockedError(StoreError):
    """Another server is using the data dir."""


class IncompatibleStoreError(StoreError):
    """The data dir holds something this outrig cannot read (another format version, not a store)."""


class ProcessTuningError(SpaceError):
    """A process-wide setting (service/process.py) could not be applied and was left as it was."""
