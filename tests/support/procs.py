"""Re-export of ``fleet.testing.procs`` (test-and-bench support lives outside tests/)."""

from fleet.testing.procs import *  # noqa: F403
