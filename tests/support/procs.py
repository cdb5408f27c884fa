"""Re-export of ``narwhal_testing.procs`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.procs import *  # noqa: F403
