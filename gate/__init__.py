"""NodeGate: a Kubernetes-native package manager for the host layer of GPU and CPU fleets."""

__version__ = "0.1.0"
