"""Wiring the campaigns into Locust: options, the per-process state, messages, the shape that
runs each campaign, and the verdict at the end.

Importing this module registers its listeners on Locust's events; `locustfile.py` imports it
after initialising gRPC's gevent support.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from locust import LoadTestShape, User, events
from locust.env import Environment

from outrig.loadtest import control
from outrig.loadtest.acks import AckWorker, JobWorker, JobWriter
from outrig.loadtest.acks_coordinator import AckCoordinator
from outrig.loadtest.control import CommandController, Controller
from outrig.loadtest.coordinator import StressCoordinator
from outrig.loadtest.link import Link
from outrig.loadtest.mix import MixCoordinator, MixUser, MixWorker, mix_worker, set_mix_worker
from outrig.loadtest.options import (
    AckParams,
    MixParams,
    StressParams,
    add_arguments,
    campaign_of,
    params_from,
)
from outrig.loadtest.report import AckVerdict, Verdict
from outrig.loadtest.stress import Reader, StressWorker, Writer, set_worker, worker

__all__ = ["CampaignShape", "JobWorker", "JobWriter", "MixUser", "Reader", "Writer"]

log = logging.getLogger("outrig.loadtest")


@dataclass
class _State:
    link: Link | None = None
    stress: StressCoordinator | None = None
    mix: MixCoordinator | None = None
    acks: AckCoordinator | None = None
    verdict: Verdict | AckVerdict | None = None


_state = _State()


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    add_arguments(parser)


def _refuse(message: str) -> None:
    log.error("outrig campaign: %s", message)
    raise SystemExit(f"outrig campaign: {message}")


@events.init.add_listener
def _on_init(environment: Environment, **_kwargs: Any) -> None:
    if environment.runner is None or environment.parsed_options is None:
        return  # --list and the like: nothing runs
    link = Link(environment)
    _state.link = link
    link.on_master("outrig-progress", _on_progress)
    link.on_master("outrig-report", _on_report)
    link.on_worker("outrig-phase", lambda data: worker().on_phase(data))
    link.on_worker("outrig-entries", lambda data: worker().receive(data))
    link.on_worker("outrig-report-request", _send_report)
    if not link.decides:
        return
    options = environment.parsed_options
    try:
        params = params_from(options)
    except ValueError as err:
        _refuse(str(err))
        return
    if not environment.host:
        _refuse("--host HOST:PORT (the outrig server's address) is required")
    host = str(environment.host)
    controller: Controller | None = control.installed()
    if controller is None and options.kill_command and options.restart_command:
        controller = CommandController(options.kill_command, options.restart_command, host)
    if isinstance(params, MixParams):
        if params.mix_kills and controller is None:
            _refuse(
                f"--mix-kills {params.mix_kills} needs a way to kill and restart the server: run the "
                "campaign with `outrig stress`, or give --kill-command and --restart-command"
            )
        _state.mix = MixCoordinator(params, link, host, controller)
        return
    if params.try_shutdown and controller is None:
        _refuse(
            f"--try-shutdown {params.try_shutdown} needs a way to kill and restart the server: "
            "run the campaign with `outrig stress`, or give --kill-command and --restart-command"
        )
    if link.role == "master" and params.num_entries % params.num_writers:
        _refuse(
            f"--num-entries {params.num_entries} must be a multiple of --num-writers {params.num_writers} "
            "when the writers are spread over workers"
        )
    if isinstance(params, AckParams):
        _state.acks = AckCoordinator(params, link, host, controller)
        return
    _state.stress = StressCoordinator(params, link, host, controller)


def _on_progress(data: Any, sender: str) -> None:
    if _state.stress is not None:
        _state.stress.on_progress(data, sender)
    elif _state.acks is not None:
        _state.acks.on_progress(data, sender)


def _on_report(data: Any, sender: str) -> None:
    if _state.stress is not None:
        _state.stress.on_report(data, sender)
    elif _state.mix is not None:
        _state.mix.on_report(data, sender)
    elif _state.acks is not None:
        _state.acks.on_report(data, sender)


def _send_report(_data: Any) -> None:
    assert _state.link is not None
    campaign = campaign_of(_options())
    if campaign == "random":
        _state.link.to_master("outrig-report", mix_worker().report())
    elif campaign == "at-least-once":
        _state.link.to_master("outrig-report", AckWorker.running().report())
    else:
        _state.link.to_master("outrig-report", worker().report())


_environment: Environment | None = None


def _options() -> Any:
    assert _environment is not None
    return _environment.parsed_options


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_kwargs: Any) -> None:
    global _environment
    _environment = environment
    if _state.link is None or not _state.link.runs_users:
        return
    params = params_from(environment.parsed_options)
    if isinstance(params, MixParams):
        set_mix_worker(MixWorker(environment, params, _state.link))
    elif isinstance(params, AckParams):
        AckWorker.run(AckWorker(environment, params, _state.link))
    else:
        set_worker(StressWorker(environment, params, _state.link))


@events.quitting.add_listener
def _on_quitting(environment: Environment, **_kwargs: Any) -> None:
    if _state.stress is not None:
        _state.verdict = _state.stress.conclude_now()
    elif _state.mix is not None:
        _state.mix.ask_for_reports()
        _state.verdict = _state.mix.conclude()
    elif _state.acks is not None:
        _state.acks.ask_for_reports()
        _state.verdict = _state.acks.conclude()
    if _state.verdict is not None:
        environment.process_exit_code = 0 if _state.verdict.passed else 1


@events.quit.add_listener
def _on_quit(**_kwargs: Any) -> None:
    """Locust has printed its statistics; the verdict goes last."""
    verdict = _state.verdict
    if verdict is None:
        return
    for note in verdict.notes:
        print(note)
    for reason in verdict.reasons():
        print(f"failed: {reason}")
    print(verdict.line(), flush=True)


class CampaignShape(LoadTestShape):
    """Runs the chosen campaign: all writers and readers at once until the stress campaign is
    over, or the random mix's steps for its duration; then Locust stops."""

    def tick(self) -> tuple[int, float, list[type[User]]] | None:
        if _state.stress is not None:
            return self._stress(_state.stress)
        if _state.mix is not None:
            return self._mix(_state.mix)
        if _state.acks is not None:
            return self._acks(_state.acks)
        return None

    def _stress(self, coordinator: StressCoordinator) -> tuple[int, float, list[type[User]]] | None:
        if coordinator.finished:
            return None
        coordinator.advance()
        params: StressParams = coordinator.params
        Writer.fixed_count = params.num_writers
        Reader.fixed_count = params.num_readers
        users = params.num_writers + params.num_readers
        return users, float(users), [Writer, Reader]

    def _mix(self, coordinator: MixCoordinator) -> tuple[int, float, list[type[User]]] | None:
        params = coordinator.params
        elapsed = self.get_run_time()
        if elapsed < params.duration:
            coordinator.maybe_kill(elapsed)
            return params.users_at(elapsed), float(params.step_users), [MixUser]
        coordinator.ask_for_reports()  # the workers stop starting operations and account for them
        workers = getattr(self.runner, "worker_count", 1)
        if not coordinator.ready(workers):
            return params.users_at(elapsed), float(params.step_users), [MixUser]
        coordinator.conclude()
        return None

    def _acks(self, coordinator: AckCoordinator) -> tuple[int, float, list[type[User]]] | None:
        if coordinator.finished:
            return None
        coordinator.advance()
        if coordinator.ready(getattr(self.runner, "worker_count", 1)):
            coordinator.conclude()
            return None
        params = coordinator.params
        JobWriter.fixed_count = params.num_writers
        JobWorker.fixed_count = params.num_readers
        users = params.num_writers + params.num_readers
        return users, float(users), [JobWriter, JobWorker]
