"""Re-export of ``fleet.testing.fleet`` (test-and-bench support lives outside tests/)."""

from fleet.testing.fleet import *  # noqa: F403
