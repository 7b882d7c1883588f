"""How `outrig serve` logs: text lines for a terminal, or one JSON object per line for a log
pipeline (`--log-format json`), on standard error either way; and `Throttle`, which keeps what a
client can make the server log (by sending the same bad request again and again) to a line every
so often."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Hashable
from typing import Any, Final

__all__ = ["JsonFormatter", "Throttle", "configure_logging"]

_TEXT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """{"time": ISO 8601 UTC, "level", "logger"[, "worker"], "message"[, "exception"]} per record
    ("worker": which worker of `outrig serve --workers N` logged it)."""

    def __init__(self, worker: str = "") -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.worker:
            document["worker"] = self.worker
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False)

    converter = staticmethod(time.gmtime)


def configure_logging(level: str, log_format: str, worker: str = "") -> None:
    """Log to stderr; a worker of `outrig serve --workers N` names itself (`worker`) in each line."""
    handler = logging.StreamHandler(sys.stderr)
    text = _TEXT.replace("%(name)s", f"%(name)s [{worker}]") if worker else _TEXT
    handler.setFormatter(JsonFormatter(worker) if log_format == "json" else logging.Formatter(text))
    logging.basicConfig(level=level, handlers=[handler])


class Throttle:
    """At most one log line per key every `interval` seconds; the lines held back in between are
    counted, and the next line let through says how many there were. Keys must come from a small
    set the server chooses (a method name, an exception type), never from a request: each is
    remembered. `clock` returns seconds (monotonic); tests pass a fake one."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._next: dict[Hashable, float] = {}  # when a line for the key may be logged again
        self._held: dict[Hashable, int] = {}  # lines held back since the last one logged

    def admit(self, key: Hashable) -> int | None:
        """None if a line for `key` was let through less than `interval` seconds ago (this one is
        counted, and held back); else how many were held back since the last one let through."""
        now = self._clock()
        if now < self._next.get(key, -float("inf")):
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._next[key] = now + self._interval
        return self._held.pop(key, 0)

    def log(
        self, logger: logging.Logger, level: int, key: Hashable, message: str, *args: Any, **kwargs: Any
    ) -> bool:
        """Log `message % args` unless `admit(key)` holds it back, with the count of those held
        back before it; `kwargs` (exc_info) as for `Logger.log`. True if it was logged."""
        held = self.admit(key)
        if held is None:
            return False
        if held:
            message += f" (and {held} more like it since the last such line, not logged)"
        logger.log(level, message, *args, **kwargs)
        return True
