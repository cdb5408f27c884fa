"""``narwhal-up``: the embedded demo stack (see ``fleet/up/main.py``)."""

from fleet.up.main import main

__all__ = ["main"]
