"""Re-export of ``fleet.testing.etcd_ha`` (test-and-bench support lives outside tests/)."""

from fleet.testing.etcd_ha import *  # noqa: F403
