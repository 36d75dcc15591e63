"""What runs inside a package pod on the node: stages, checks and interrupts, chrooted into the host.

Importable with pydantic, PyYAML and the standard library alone: the agent image carries no
Kubernetes client, and nothing here talks to the API server. The operator learns how a stage went
from the exit code and the JSON summary in the pod's termination message.
"""
