"""Re-export of ``narwhal_testing.metrics`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.metrics import *  # noqa: F403
