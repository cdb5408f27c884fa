"""Re-export of ``fleet.testing.smallfs`` (test-and-bench support lives outside tests/)."""

from fleet.testing.smallfs import *  # noqa: F403
