"""Re-export of ``fleet.testing.tcp_proxy`` (test-and-bench support lives outside tests/)."""

from fleet.testing.tcp_proxy import *  # noqa: F403
