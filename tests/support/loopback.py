"""Re-export of ``fleet.testing.loopback`` (test-and-bench support lives outside tests/)."""

from fleet.testing.loopback import *  # noqa: F403
