"""Re-export of ``narwhal_testing.restart_fakes`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.restart_fakes import *  # noqa: F403
