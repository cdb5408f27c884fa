"""Re-export of ``narwhal_testing.ha`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.ha import *  # noqa: F403
