"""The agent's error vocabulary: each kind maps to one exit behaviour of `nodegate agent`."""

from __future__ import annotations


class AgentError(Exception):
    """A failure reported as one line; nothing on the host was changed when it is raised."""


class PackageError(AgentError):
    """The package is unusable: bad package.yaml, a missing script, a missing overlay directory.

    Permanent: retrying the same image cannot help, so the operator should mark the node failed.
    """


class ConfigMismatch(AgentError):
    """The config in the mounted ConfigMap is not the config the operator started the stage with (its
    digest on the pod differs): the ConfigMap was replaced or created ahead by someone else.

    Permanent: the pod mounts the same ConfigMap again on a retry."""


class HostError(AgentError):
    """The host root filesystem or the agent's own state on it is unusable (missing root, corrupt history)."""


class UsageError(AgentError):
    """The invocation is wrong: a missing flag, an upgrade without a known previous version."""
