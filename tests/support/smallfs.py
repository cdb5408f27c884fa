"""Re-export of ``narwhal_testing.smallfs`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.smallfs import *  # noqa: F403
