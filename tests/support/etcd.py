"""Re-export of ``narwhal_testing.etcd`` (test-and-bench support lives outside tests/)."""

from narwhal_testing.etcd import *  # noqa: F403
