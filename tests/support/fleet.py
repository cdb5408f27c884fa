"""Re-export of ``narwhal_testing.fleet`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.fleet import *  # noqa: F403
