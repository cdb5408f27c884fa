"""Re-export of ``fleet.testing.waits`` (test-and-bench support lives outside tests/)."""

from fleet.testing.waits import *  # noqa: F403
