"""Re-export of ``narwhal_testing.waits`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.waits import *  # noqa: F403
