"""Re-export of ``narwhal_testing.etcd_ha`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.etcd_ha import *  # noqa: F403
