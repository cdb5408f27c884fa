"""Re-export of ``narwhal_testing.loopback`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.loopback import *  # noqa: F403
