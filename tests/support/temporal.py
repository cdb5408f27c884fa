"""Re-export of ``fleet.testing.temporal`` (test-and-bench support lives outside tests/)."""

from fleet.testing.temporal import *  # noqa: F403
