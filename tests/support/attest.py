"""Re-export of ``fleet.testing.attest`` (test-and-bench support lives outside tests/)."""

from fleet.testing.attest import *  # noqa: F403
