"""Re-export of ``narwhal_testing.tcp_proxy`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.tcp_proxy import *  # noqa: F403
