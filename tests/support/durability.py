"""Re-export of ``fleet.testing.durability`` (test-and-bench support lives outside tests/)."""

from fleet.testing.durability import *  # noqa: F403
