"""Re-export of ``narwhal_testing.durability`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.durability import *  # noqa: F403
