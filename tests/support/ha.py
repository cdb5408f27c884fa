"""Re-export of ``fleet.testing.ha`` (test-and-bench support lives outside tests/)."""

from fleet.testing.ha import *  # noqa: F403
