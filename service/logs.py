"""How `outrig serve` logs: text lines for a terminal, or one JSON object per line for a log
pipeline (`--log-format json`), on standard error either way."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Final

__all__ = ["JsonFormatter", "configure_logging"]

_TEXT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """{"time": ISO 8601 UTC, "level", "logger", "message"[, "exception"]} per record."""

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False)

    converter = staticmethod(time.gmtime)


def configure_logging(level: str, log_format: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT))
    logging.basicConfig(level=level, handlers=[handler])
