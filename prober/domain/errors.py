"""Every error leakprobe reports to a person, under one root, so a command catches `LeakprobeError` once and
prints its message as one line (exit 2) while a bug still surfaces as a traceback.

    LeakprobeError                the message is for the operator: it names what to fix
    ├── ConfigError               a config file, flag or environment variable that cannot be used
    │   ├── YAMLFileError         the file is not readable YAML
    │   └── EngineConfigError     the reference engine's own config (`leakprobe testbed`)
    ├── CredentialError           a tenant's key: variable unset, secret file unreadable
    ├── LedgerError               the ledger cannot be opened, read or written
    ├── CanaryKeyError            the key that MACs canary tokens is missing or unusable
    ├── PackError                 a canary pack or filler corpus is malformed
    ├── EmbedderError             the embedding model cannot be loaded
    ├── PlanError                 no plan fits: the budget, the capacity or the tenants do not allow one
    ├── PromptError               a prompt cannot be built to an exact token count
    │   ├── CountError            the target's tokens cannot be counted
    │   └── BuildError            no text reaches the length asked for
    ├── TargetUnusable            the target cannot be probed (unreachable, a credential refused)
    ├── AdapterBuildError         a canary adapter cannot be built (peft missing, it did not learn its canary)
    └── StartupError              the daemon cannot start (port taken, ledger unusable)

What a target answers is never raised: adapters return a typed `TargetError` inside the result, because a
hostile or broken answer is an observation, not a failure of leakprobe.
"""

from __future__ import annotations


class LeakprobeError(Exception):
    """An error whose message tells the operator what to fix."""


class ConfigError(LeakprobeError):
    pass


class YAMLFileError(ConfigError):
    pass


class EngineConfigError(ConfigError):
    pass


class CredentialError(LeakprobeError):
    pass


class LedgerError(LeakprobeError):
    pass


class CanaryKeyError(LeakprobeError):
    pass


class PackError(LeakprobeError):
    pass


class EmbedderError(LeakprobeError):
    pass


class PlanError(LeakprobeError):
    pass


class PromptError(LeakprobeError):
    pass


class CountError(PromptError):
    pass


class BuildError(PromptError):
    pass


class TargetUnusable(LeakprobeError):
    pass


class StartupError(LeakprobeError):
    pass


class AdapterBuildError(LeakprobeError):
    pass
