"""Re-export of ``narwhal_testing.etcd_tls``."""

from narwhal_testing.etcd_tls import *  # noqa: F403
