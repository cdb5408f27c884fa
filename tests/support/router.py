"""Re-export of ``narwhal_testing.router`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.router import *  # noqa: F403
