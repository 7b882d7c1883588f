"""The campaigns' parameters: profiles, shares, kill schedules, and checks that name the option."""

from __future__ import annotations

import argparse

import pytest

from outrig.loadtest.options import (
    AckParams,
    MixParams,
    StressParams,
    add_arguments,
    namespace_args,
    params_from,
)


def _parse(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(args)


def test_the_profiles_carry_the_originals_full_size_values() -> None:
    full = params_from(_parse("--campaign", "stress-with-shutdown"))
    assert isinstance(full, StressParams)
    assert (full.num_entries, full.num_writers, full.num_readers) == (10_000, 500, 500)
    assert (full.try_shutdown, full.restart_wait, full.query_timeout) == (1, 10.0, 10.0)
    assert not (full.use_if_exists or full.interleave or full.verify_takes)
    assert full.retry == "sdk"
    assert full.lease == 7 * 24 * 3600
    plain = params_from(_parse())  # plain locust: the stress profile, which kills nothing
    assert isinstance(plain, StressParams) and plain.try_shutdown == 0
    assert isinstance(params_from(_parse("--campaign", "random")), MixParams)


def test_given_options_win_over_the_profile() -> None:
    params = params_from(
        _parse(
            "--campaign",
            "stress-with-shutdown",
            "--num-entries",
            "1000",
            "--num-writers",
            "20",
            "--try-shutdown",
            "2",
            "--interleave",
            "--retry",
            "original",
            "--query-timeout",
            "0.5",
        )
    )
    assert isinstance(params, StressParams)
    assert (params.num_entries, params.num_writers, params.num_readers) == (1000, 20, 500)
    assert (params.try_shutdown, params.interleave, params.retry, params.query_timeout) == (
        2,
        True,
        "original",
        0.5,
    )


@pytest.mark.parametrize(("entries", "writers"), [(10_000, 500), (1000, 7), (5, 5), (13, 4)])
def test_the_writers_shares_add_up_to_num_entries(entries: int, writers: int) -> None:
    params = StressParams(num_entries=entries, num_writers=writers)
    shares = [params.share(writer) for writer in range(writers)]
    assert sum(shares) == entries
    assert max(shares) - min(shares) <= 1


def test_kill_schedules() -> None:
    # Not interleaved: the first kill once every write is done (before any take), more spread over the takes.
    assert StressParams(num_entries=1000, try_shutdown=1).kill_after_takes() == [0]
    assert StressParams(num_entries=1000, try_shutdown=2).kill_after_takes() == [0, 500]
    assert StressParams(num_entries=1000, try_shutdown=1).kill_after_writes() == []
    # Interleaved: after half the writes for one kill, as the original.
    assert StressParams(num_entries=1000, try_shutdown=1, interleave=True).kill_after_writes() == [500]
    assert StressParams(num_entries=900, try_shutdown=2, interleave=True).kill_after_writes() == [300, 600]
    assert StressParams(num_entries=1000, try_shutdown=0).kill_after_takes() == []


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--num-entries", "0"], "--num-entries"),
        (["--num-writers", "0"], "--num-writers"),
        (["--num-entries", "10", "--num-writers", "11"], "--num-writers"),
        (["--num-readers", "0"], "--num-readers"),
        (["--try-shutdown", "-1"], "--try-shutdown"),
        (["--restart-wait", "-1"], "--restart-wait"),
        (["--query-timeout", "0"], "--query-timeout"),
        (["--campaign", "random", "--max-users", "0"], "--max-users"),
        (["--campaign", "random", "--duration", "0"], "--duration"),
    ],
)
def test_bad_values_are_refused_naming_the_option(args: list[str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        params_from(_parse(*args))


def test_namespace_args_round_trip() -> None:
    given = _parse(
        "--campaign", "stress", "--num-entries", "40", "--verify-takes", "--kill-command", "kill -9 1"
    )
    again = _parse(*namespace_args(given))
    assert vars(again) == vars(given)


def test_mix_steps_up_to_max_users() -> None:
    mix = MixParams(max_users=25, step_users=10, step_seconds=5.0)
    assert [mix.users_at(t) for t in (0, 4.9, 5, 10, 15, 100)] == [10, 10, 20, 25, 25, 25]


def test_the_at_least_once_profile_and_its_checks() -> None:
    params = params_from(_parse("--campaign", "at-least-once", "--num-entries", "300", "--ack-deadline", "2"))
    assert isinstance(params, AckParams)
    assert (params.num_entries, params.ack_deadline, params.max_deliveries, params.try_shutdown) == (
        300,
        2.0,
        4,
        1,
    )
    assert params.space == "jobs"
    assert params.kill_after_acks(300) == [150]
    for bad, named in [
        (["--ack-deadline", "0"], "--ack-deadline"),
        (["--max-deliveries", "1"], "--max-deliveries"),
        (["--poison-share", "1.5"], "--poison-share"),
        (["--abandon-share", "0.6", "--nack-share", "0.6"], "--abandon-share"),
        (["--num-writers", "0"], "--num-writers"),
    ]:
        with pytest.raises(ValueError, match=named):
            params_from(_parse("--campaign", "at-least-once", *bad))
    args = namespace_args(_parse("--campaign", "at-least-once", "--nack-share", "0.2"))
    assert args == ["--campaign", "at-least-once", "--nack-share", "0.2"]
