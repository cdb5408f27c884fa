"""Re-export of ``narwhal_testing.temporal`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.temporal import *  # noqa: F403
