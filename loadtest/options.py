"""The campaigns' parameters: their names, meanings and profiles, as Locust command-line options.

The stress options keep StressTestWithShutdown's parameter names (num_entries, num_writers,
num_readers, tryShutdown, restart_wait, query_timeout, use_IfExists, interleave, verify_takes) as
``--num-entries`` and so on. A profile gives every option its default: ``stress-with-shutdown``
is the original's full-size run, ``stress`` the same without the kill, ``random`` the free-running
mix, ``at-least-once`` jobs taken with an acknowledgement deadline (loadtest/acks.py). Locust
already has a ``--profile`` option, so inside Locust the profile is ``--campaign``; ``outrig
stress --profile`` passes it on.

Nothing here imports Locust, so `outrig stress --help` and the tests can use it without gevent.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

__all__ = [
    "CAMPAIGNS",
    "AckParams",
    "Campaign",
    "MixParams",
    "RetryPath",
    "StressParams",
    "add_arguments",
    "params_from",
]

Campaign = Literal["stress-with-shutdown", "stress", "random", "at-least-once"]
RetryPath = Literal["sdk", "original"]

CAMPAIGNS: Final[tuple[Campaign, ...]] = ("stress-with-shutdown", "stress", "random", "at-least-once")
_STRESS_NUMBERS: Final = (
    "num_entries",
    "num_writers",
    "num_readers",
    "try_shutdown",
    "restart_wait",
    "query_timeout",
)
_SWITCHES: Final = ("use_if_exists", "interleave", "verify_takes")
_MIX_NUMBERS: Final = ("max_users", "step_users", "step_seconds", "duration", "mix_kills")
_ACK_NUMBERS: Final = ("ack_deadline", "max_deliveries", "poison_share", "abandon_share", "nack_share")
_WEEK: Final = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class StressParams:
    """StressTestWithShutdown's parameters, with the original .td file's values as defaults."""

    num_entries: int = 10_000
    num_writers: int = 500
    num_readers: int = 500
    try_shutdown: int = 1
    restart_wait: float = 10.0
    query_timeout: float = 10.0
    use_if_exists: bool = False
    interleave: bool = False
    verify_takes: bool = False
    retry: RetryPath = "sdk"
    space: str = "stress"
    lease: float = _WEEK  # each write asks for a one-week lease, as the original's do

    def check(self) -> None:
        """Raise ValueError naming the first parameter out of range."""
        if self.num_entries < 1:
            raise ValueError(f"--num-entries must be >= 1, got {self.num_entries}")
        if self.num_writers < 1 or self.num_writers > self.num_entries:
            raise ValueError(f"--num-writers must be between 1 and --num-entries, got {self.num_writers}")
        if self.num_readers < 1:
            raise ValueError(f"--num-readers must be >= 1, got {self.num_readers}")
        if self.try_shutdown < 0:
            raise ValueError(f"--try-shutdown must be >= 0, got {self.try_shutdown}")
        if self.restart_wait < 0:
            raise ValueError(f"--restart-wait must be >= 0 seconds, got {self.restart_wait}")
        if self.query_timeout <= 0:
            raise ValueError(f"--query-timeout must be > 0 seconds, got {self.query_timeout}")

    def share(self, writer: int) -> int:
        """How many entries writer number ``writer`` (from 0) writes: num_entries/num_writers,
        the remainder going one each to the first writers."""
        base, extra = divmod(self.num_entries, self.num_writers)
        return base + (1 if writer < extra else 0)

    def kill_after_writes(self) -> list[int]:
        """With interleave: the acknowledged-write counts after which the server is killed,
        spread evenly (one kill: after half the writes, as the original)."""
        if not self.interleave:
            return []
        return [k * self.num_entries // (self.try_shutdown + 1) for k in range(1, self.try_shutdown + 1)]

    def kill_after_takes(self) -> list[int]:
        """Without interleave: the first kill comes once every write is done, before the readers
        start (take count 0); further kills are spread over the takes."""
        if self.interleave or self.try_shutdown == 0:
            return []
        return [k * self.num_entries // self.try_shutdown for k in range(self.try_shutdown)]


@dataclass(frozen=True, slots=True)
class MixParams:
    """The random mix: users step up from ``step_users`` by ``step_users`` every ``step_seconds``
    to ``max_users``, for ``duration`` seconds in all."""

    max_users: int = 50
    step_users: int = 10
    step_seconds: float = 10.0
    duration: float = 60.0
    space: str = "mix"
    mix_kills: int = 0  # SIGKILLs of the server (or of one worker) spread over the duration

    def check(self) -> None:
        if self.max_users < 1:
            raise ValueError(f"--max-users must be >= 1, got {self.max_users}")
        if self.step_users < 1:
            raise ValueError(f"--step-users must be >= 1, got {self.step_users}")
        if self.step_seconds <= 0:
            raise ValueError(f"--step-seconds must be > 0, got {self.step_seconds}")
        if self.duration <= 0:
            raise ValueError(f"--duration must be > 0 seconds, got {self.duration}")
        if self.mix_kills < 0:
            raise ValueError(f"--mix-kills must be >= 0, got {self.mix_kills}")

    def kill_times(self) -> list[float]:
        """When the kills come: spread evenly over the duration."""
        return [self.duration * (i + 1) / (self.mix_kills + 1) for i in range(self.mix_kills)]

    def users_at(self, elapsed: float) -> int:
        return min(self.max_users, self.step_users * (1 + int(elapsed // self.step_seconds)))


@dataclass(frozen=True, slots=True)
class AckParams:
    """The at-least-once campaign (loadtest/acks.py): ``num_writers`` writers write ``num_entries``
    jobs, a ``poison_share`` of them poison; ``num_readers`` workers take them with an ``ack_deadline``
    (seconds) and ``max_deliveries``, and ack, except that, before a job's last two deliveries, an
    ``abandon_share`` of them walk away from the receipt (a killed worker) and a ``nack_share``
    nack; poison jobs are always nacked. The server is killed ``try_shutdown`` times, spread over
    the acks, ``restart_wait`` seconds each."""

    num_entries: int = 2000
    num_writers: int = 10
    num_readers: int = 20
    try_shutdown: int = 1
    restart_wait: float = 2.0
    query_timeout: float = 0.5
    ack_deadline: float = 5.0
    max_deliveries: int = 4
    poison_share: float = 0.05
    abandon_share: float = 0.1
    nack_share: float = 0.1
    space: str = "jobs"
    lease: float = _WEEK

    def check(self) -> None:
        """Raise ValueError naming the first parameter out of range."""
        StressParams(**{name: getattr(self, name) for name in _STRESS_NUMBERS}).check()  # the shared ones
        if self.ack_deadline <= 0:
            raise ValueError(f"--ack-deadline must be > 0 seconds, got {self.ack_deadline}")
        if self.max_deliveries < 2:
            raise ValueError(f"--max-deliveries must be >= 2, got {self.max_deliveries}")
        for name in ("poison_share", "abandon_share", "nack_share"):
            share = getattr(self, name)
            if not 0 <= share <= 1:
                raise ValueError(f"--{name.replace('_', '-')} must be between 0 and 1, got {share}")
        if self.abandon_share + self.nack_share > 1:
            raise ValueError("--abandon-share and --nack-share must add up to at most 1")

    def share(self, writer: int) -> int:
        """How many jobs writer number ``writer`` (from 0) writes (as `StressParams.share`)."""
        base, extra = divmod(self.num_entries, self.num_writers)
        return base + (1 if writer < extra else 0)

    def kill_after_acks(self, jobs: int) -> list[int]:
        """The acked-job counts after which the server is killed, spread evenly over `jobs`."""
        return [k * jobs // (self.try_shutdown + 1) for k in range(1, self.try_shutdown + 1)]


def _profile_defaults(campaign: Campaign) -> StressParams:
    return StressParams(try_shutdown=1 if campaign == "stress-with-shutdown" else 0)


def add_arguments(parser: Any, *, campaign_flag: str = "--campaign") -> None:
    """Add the campaign options to ``parser`` (Locust's configargparse parser, or argparse's).
    Every default is None here: the profile fills in what is not given (see `params_from`)."""
    group = parser.add_argument_group("outrig campaign")
    group.add_argument(
        campaign_flag,
        dest="campaign",
        choices=CAMPAIGNS,
        default=None,
        help="stress-with-shutdown (default under `outrig stress`), stress (no kill; the default for "
        "plain locust), random (the free-running mix), or at-least-once (jobs taken with an "
        "acknowledgement deadline, acked, abandoned, nacked and dead-lettered)",
    )
    stress: list[tuple[str, type, str]] = [
        ("--num-entries", int, "entries written, then each read and taken once (10000)"),
        ("--num-writers", int, "writer users; each writes num_entries/num_writers entries (500)"),
        ("--num-readers", int, "reader users; together they read and take every entry (500)"),
        ("--try-shutdown", int, "times the server is killed with SIGKILL and restarted (1; 0 for stress)"),
        ("--restart-wait", float, "seconds between a kill and the restart (10)"),
        ("--query-timeout", float, "timeout of every read and take, in seconds (10)"),
    ]
    _add_valued(group, stress)
    for flag, text in [
        ("--use-if-exists", "read_nowait/take_nowait (readIfExists/takeIfExists) instead of blocking calls"),
        ("--interleave", "readers run alongside the writers, and the kill comes after half the writes"),
        ("--verify-takes", "after each take, a read of the same template must find nothing"),
    ]:
        group.add_argument(flag, action="store_true", default=False, help=text)
    group.add_argument(
        "--retry",
        choices=["sdk", "original"],
        default=None,
        help="sdk (default): the SDK retries with request ids; original: no SDK retries, and a call the "
        "kill broke is retried once after the restart by the original's rules",
    )
    group.add_argument(
        "--space", default=None, metavar="NAME", help="the space to use (stress, or mix for random)"
    )
    group.add_argument(
        "--kill-command",
        default=None,
        metavar="CMD",
        help="shell command that kills the server (for --try-shutdown against a server "
        "that the campaign did not start)",
    )
    group.add_argument(
        "--restart-command", default=None, metavar="CMD", help="shell command that starts the server again"
    )
    mix: list[tuple[str, type, str]] = [
        ("--max-users", int, "random: most users at once (50)"),
        ("--step-users", int, "random: users added per step (10)"),
        ("--step-seconds", float, "random: seconds per step (10)"),
        ("--duration", float, "random: seconds the mix runs (60)"),
        (
            "--mix-kills",
            int,
            "random: SIGKILLs of the server (of one worker, in turn, under --workers) spread over "
            "the duration (0)",
        ),
    ]
    _add_valued(group, mix)
    acks: list[tuple[str, type, str]] = [
        ("--ack-deadline", float, "at-least-once: seconds each take gives its worker to ack (5)"),
        ("--max-deliveries", int, "at-least-once: deliveries before a job goes to the dead-letter space (4)"),
        ("--poison-share", float, "at-least-once: share of the jobs that always fail (0.05)"),
        ("--abandon-share", float, "at-least-once: share of deliveries whose worker walks away (0.1)"),
        ("--nack-share", float, "at-least-once: share of deliveries nacked (0.1)"),
    ]
    _add_valued(group, acks)


def _add_valued(group: Any, options: list[tuple[str, type, str]]) -> None:
    """Options of a number (N) or of seconds (S), None unless given."""
    for flag, kind, text in options:
        metavar = "N" if kind is int else "F" if "share" in flag else "S"
        group.add_argument(flag, type=kind, default=None, metavar=metavar, help=text)


def _given(options: Any, name: str) -> Any:
    return getattr(options, name, None)


def campaign_of(options: Any, default: Campaign = "stress") -> Campaign:
    value = _given(options, "campaign")
    return value if value in CAMPAIGNS else default


P = TypeVar("P", MixParams, AckParams)


def _given_or_default(cls: type[P], options: Any, names: tuple[str, ...]) -> P:
    """`cls` with the options given, its defaults for the others."""
    defaults = cls()
    return cls(
        **{
            name: _given(options, name) if _given(options, name) is not None else getattr(defaults, name)
            for name in names
        }
    )


def params_from(options: Any) -> StressParams | MixParams | AckParams:
    """The checked parameters for the options' campaign (ValueError naming a bad option)."""
    campaign = campaign_of(options)
    if campaign == "at-least-once":
        acks = _given_or_default(AckParams, options, (*_STRESS_NUMBERS, *_ACK_NUMBERS, "space"))
        acks.check()
        return acks
    if campaign == "random":
        mix = _given_or_default(MixParams, options, (*_MIX_NUMBERS, "space"))
        mix.check()
        return mix
    base = _profile_defaults(campaign)
    values: dict[str, Any] = {}
    for name in _STRESS_NUMBERS:
        given = _given(options, name)
        values[name] = given if given is not None else getattr(base, name)
    for name in _SWITCHES:
        values[name] = bool(_given(options, name))
    values["retry"] = _given(options, "retry") or base.retry
    values["space"] = _given(options, "space") or base.space
    params = StressParams(**values)
    params.check()
    return params


def namespace_args(options: argparse.Namespace) -> list[str]:
    """The campaign options of ``options`` as command-line arguments again (for `outrig stress`,
    which hands them to Locust)."""
    args: list[str] = []
    if options.campaign is not None:
        args += ["--campaign", options.campaign]
    names = (
        *_STRESS_NUMBERS,
        "retry",
        "space",
        "kill_command",
        "restart_command",
        *_MIX_NUMBERS,
        *_ACK_NUMBERS,
    )
    for name in names:
        value = getattr(options, name, None)
        if value is not None:
            args += ["--" + name.replace("_", "-"), str(value)]
    for name in _SWITCHES:
        if getattr(options, name, False):
            args.append("--" + name.replace("_", "-"))
    return args
