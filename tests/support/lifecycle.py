"""Re-export of ``narwhal_testing.lifecycle`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.lifecycle import *  # noqa: F403
