"""Re-export of ``fleet.testing.restart_fakes`` (test-and-bench support lives outside tests/)."""

from fleet.testing.restart_fakes import *  # noqa: F403
