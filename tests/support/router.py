"""Re-export of ``fleet.testing.router`` (test-and-bench support lives outside tests/)."""

from fleet.testing.router import *  # noqa: F403
