"""Re-export of ``fleet.testing.etcd`` (test-and-bench support lives outside tests/)."""

from fleet.testing.etcd import *  # noqa: F403
