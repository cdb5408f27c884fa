"""Re-export of ``fleet.testing.lifecycle`` (test-and-bench support lives outside tests/)."""

from fleet.testing.lifecycle import *  # noqa: F403
