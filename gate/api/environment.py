"""Environment variable names that never reach a package's steps or NodeGate's agent (pure: no I/O).

A gate's `env` becomes the environment of the agent container (run as root, chrooted into the host),
and the agent passes the names a package declares on to its scripts. Some names are not data but
code: they tell a dynamic loader which library to load first (`LD_PRELOAD`), an interpreter which
file to run before anything else (`PYTHONSTARTUP`, `BASH_ENV`, `PERL5OPT`, `NODE_OPTIONS`), or a
program which command to run for a routine job (`BROWSER`, `PAGER`, `GIT_SSH_COMMAND`). Whoever sets
one of them on a root process runs their own code as root, whatever the package's scripts say.

So these names are never passed, declared or not: admission refuses them in any gate
(`gate.admission.rules.nodegate`), the operator leaves them out of the stage pod's env even when a
write got past admission (`gate.controller.pods`), a package manifest that declares one is refused
by `nodegate package lint` and by the agent (`gate.agent.package`), and the agent refuses a stage
whose gate gives one before it touches the host. `PATH` and `HOME` are NodeGate's own: a step gets
a fixed safe `PATH` and `HOME=/root`.

The list is documented in docs/packages.md ("Names never passed"); keep the two in step.
"""

from __future__ import annotations

from typing import Final

RESERVED_PREFIX: Final = "NODEGATE_"
"""NodeGate's own variables (the stage, the node, the config directory): the agent sets them."""

NEVER_PASSED_NAMES: Final = frozenset({
    # NodeGate's own for every step: a fixed safe PATH (no directory a spec can reach), HOME=/root.
    "PATH", "HOME",
    # Shells: files sourced at start, options, word splitting, traced commands.
    "ENV", "BASH_ENV", "BASHOPTS", "SHELLOPTS", "CDPATH", "IFS", "PS4", "GLOBIGNORE", "PROMPT_COMMAND",
    "ZDOTDIR", "SHELL",
    # glibc: modules, locales and resolver files loaded from a path, tunables.
    "GCONV_PATH", "GETCONF_DIR", "HOSTALIASES", "LOCPATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS",
    "LOCALDOMAIN", "TZDIR", "GLIBC_TUNABLES",
    # Interpreters and runtimes.
    "PERLLIB", "PERLIO", "RUBYLIB", "RUBYOPT", "CLASSPATH", "TCLLIBPATH", "TCL_LIBRARY", "TK_LIBRARY",
    # Commands that programs run on a person's behalf.
    "EDITOR", "VISUAL", "PAGER", "BROWSER", "MANPAGER", "MANOPT", "LESSOPEN", "LESSCLOSE",
    "SUDO_ASKPASS", "SSH_ASKPASS", "SUDO_EDITOR", "KUBECONFIG",
})
"""Names never passed, matched exactly (case-sensitively, as the kernel compares them)."""

NEVER_PASSED_PREFIXES: Final = (
    "LD_",          # the dynamic loader: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...
    "DYLD_",        # its macOS kin, for completeness
    "PYTHON",       # PYTHONPATH, PYTHONSTARTUP, PYTHONWARNINGS, PYTHONHOME, ...
    "PERL5",        # PERL5LIB, PERL5OPT, PERL5DB
    "RUBY",         # RUBYLIB, RUBYOPT, RUBY_*
    "GEM_", "BUNDLE_",
    "NODE_",        # NODE_OPTIONS, NODE_PATH
    "NPM_CONFIG_",
    "LUA_",         # LUA_INIT runs code, LUA_PATH and LUA_CPATH load it
    "JAVA_", "_JAVA_", "JDK_",
    "BASH_FUNC_",   # exported shell functions
    "MALLOC_",      # glibc's allocator tunables
    "OPENSSL_",     # OPENSSL_CONF loads engines and providers (shared objects)
    "GIT_",         # GIT_SSH_COMMAND, GIT_EXEC_PATH, GIT_CONFIG_*
    "XDG_",         # where programs look for their configuration
    "APT_",         # APT_CONFIG: apt's hooks run commands
    "DEBCONF_",
    "SYSTEMD_",     # SYSTEMD_EDITOR, SYSTEMD_PAGER
)
"""Families of names never passed, matched by prefix."""


def never_passed_reason(name: str) -> str | None:
    """Why variable `name` never reaches the agent or a step, or None when it may (if declared)."""
    if name.startswith(RESERVED_PREFIX):
        return f"{RESERVED_PREFIX}* are NodeGate's own variables (the agent sets them)"
    if name in NEVER_PASSED_NAMES:
        return "a loader, shell or interpreter variable NodeGate never passes (docs/packages.md)"
    prefix = next((p for p in NEVER_PASSED_PREFIXES if name.startswith(p)), None)
    if prefix is not None:
        return f"{prefix}* are loader or interpreter variables NodeGate never passes (docs/packages.md)"
    return None


def never_passed(name: str) -> bool:
    return never_passed_reason(name) is not None
