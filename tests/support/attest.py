"""Re-export of ``narwhal_testing.attest`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.attest import *  # noqa: F403
