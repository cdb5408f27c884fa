"""Re-export of ``fleet.testing.metrics`` (test-and-bench support lives outside tests/)."""

from fleet.testing.metrics import *  # noqa: F403
