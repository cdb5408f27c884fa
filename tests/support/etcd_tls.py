"""Re-export of ``fleet.testing.etcd_tls``."""

from fleet.testing.etcd_tls import *  # noqa: F403
