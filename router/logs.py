"""Process logging for the console scripts: one format, and client libraries kept quiet.

httpx and httpcore log every request at INFO ("HTTP Request: GET …/ready 200"); a warm standby
polls its primary several times a second, so those lines would drown what changed. They are logged
only at DEBUG: INFO lines are our own and say what changed (takeover, fencing, drain, ejection).
"""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CLIENT_LOGGERS = ("httpx", "httpcore")


def setup_logging(level: str | int) -> None:
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    logging.basicConfig(level=numeric, format=FORMAT)
    quiet_clients(numeric)


def quiet_clients(level: int) -> None:
    """Per-request client lines only when the process runs at DEBUG."""
    client_level = logging.DEBUG if level <= logging.DEBUG else logging.WARNING
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(client_level)
