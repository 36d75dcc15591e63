"""What a config value or an env value of a package may be: the rules package.yaml declares for its config
keys (`config`) and for the env names a gate may set (`gateEnv`), and how a value is read and written.

One source for the agent (`gate.agent.config`, `gate.agent.gate_env`), which holds every package's input
against them, and for admission (`gate.admission.rules.inputs`), which holds a bound catalog package's.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel


class PackageModel(BaseModel):
    """Base of the package.yaml models: camelCase in YAML, snake_case in Python, no unknown fields."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


ConfigType = Literal["string", "int", "bool", "enum"]
# A ConfigMap key, or a glob over them (* and ?) for families of keys such as service_<unit>.conf.
CONFIG_KEY_PATTERN: Final = r"^[-._a-zA-Z0-9*?]{1,253}$"
BOOL_WORDS: Final[dict[str, bool]] = {"true": True, "false": False}


def is_glob(name: str) -> bool:
    return "*" in name or "?" in name


def parse_config_value(key: ValueRule, text: str) -> str | int | bool:
    """A config (or env) value read as its declared type; ValueError says why it is not one."""
    if key.type == "string":
        if key.pattern is not None and re.fullmatch(key.pattern, text, re.DOTALL) is None:
            raise ValueError(f"does not match the pattern {key.pattern!r}")
        return text
    word = text.strip()
    if key.type == "int":
        if re.fullmatch(r"[-+]?[0-9]+", word) is None:
            raise ValueError(f"{word!r} is not an integer")
        number = int(word)
        if key.minimum is not None and number < key.minimum:
            raise ValueError(f"{number} is below the minimum {key.minimum}")
        if key.maximum is not None and number > key.maximum:
            raise ValueError(f"{number} is above the maximum {key.maximum}")
        return number
    if key.type == "bool":
        if word.lower() not in BOOL_WORDS:
            raise ValueError(f"{word!r} is not true or false")
        return BOOL_WORDS[word.lower()]
    assert key.enum is not None, "an enum key carries its values (checked when loaded)"
    if word not in key.enum:
        raise ValueError(f"{word!r} is not one of {', '.join(key.enum)}")
    return word


DEFAULT_TYPE_OF: Final[dict[str, str]] = {"string": "str", "enum": "str", "int": "int", "bool": "bool"}


def _value_type(value: str | int | bool) -> str:
    # bool is a subclass of int: name it first.
    return "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "str"


def render_config_value(value: str | int | bool) -> str:
    """How a typed value is written for the scripts: true/false, digits, the enum word."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class ValueRule(PackageModel):
    """What a value may be: its type and, by type, its values, bounds or pattern (config keys, env names)."""

    type: ConfigType = Field(
        default="string",
        description=(
            "string: the value as given (usually a file's content); int: an integer; bool: true or false; "
            "enum: one of `enum`."
        ),
    )
    description: str = Field(default="", max_length=4096, description="What it does, for people and the catalog.")
    enum: list[Annotated[str, Field(min_length=1, max_length=253)]] | None = Field(
        default=None, min_length=1, max_length=256, description="The allowed values of an enum."
    )
    minimum: int | None = Field(default=None, description="int: the smallest allowed value.")
    maximum: int | None = Field(default=None, description="int: the largest allowed value.")
    pattern: str | None = Field(
        default=None, max_length=1024,
        description="string: a regular expression (Python syntax) the whole value must match.",
    )

    @model_validator(mode="after")
    def _rule_consistent(self) -> ValueRule:
        if (self.type == "enum") != (self.enum is not None):
            raise ValueError("enum lists the values of an enum key, and only of one" if self.enum is not None
                             else "a key of type enum needs its values in enum")
        if self.type != "int" and (self.minimum is not None or self.maximum is not None):
            raise ValueError(f"minimum and maximum are for int keys, not {self.type}")
        if self.type != "string" and self.pattern is not None:
            raise ValueError(f"pattern is for string keys, not {self.type}")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"pattern is not a regular expression: {exc}") from None
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError(f"minimum {self.minimum} is above maximum {self.maximum}")
        return self


class ConfigKey(ValueRule):
    """One config key a package accepts: its type, whether it is needed, its default."""

    required: bool = Field(default=False, description="The gate must give this key (it then has no default).")
    default: str | int | bool | None = Field(
        default=None,
        description="The value used when the gate does not give the key; written to the config directory like one.",
    )

    @model_validator(mode="after")
    def _default_consistent(self) -> ConfigKey:
        if self.required and self.default is not None:
            raise ValueError("a required key has no default (the gate must give it)")
        if self.default is not None:
            if _value_type(self.default) != DEFAULT_TYPE_OF[self.type]:
                raise ValueError(f"default {self.default!r} is not of type {self.type}"
                                 + (" (quote it)" if self.type in ("string", "enum") else ""))
            try:
                parse_config_value(self, render_config_value(self.default))
            except ValueError as exc:
                raise ValueError(f"default: {exc}") from None
        return self

    def default_text(self) -> str | None:
        return None if self.default is None else render_config_value(self.default)


class EnvDeclaration(ValueRule):
    """One environment variable a gate may set for the package's steps, and what its value may be.

    A string needs a pattern: an env value is one line for a script to use, never a file, and the
    pattern says which characters the script is ready for (a value that reaches a sourced file or a
    command line must not carry quotes, `$`, backticks or newlines)."""

    @model_validator(mode="after")
    def _string_has_pattern(self) -> EnvDeclaration:
        if self.type == "string" and self.pattern is None:
            raise ValueError("an env value of type string needs a pattern (the characters the package's scripts "
                             "are ready for), or another type: int, bool or enum")
        return self


class ConfigSpec(PackageModel):
    """The config keys a package accepts; the agent refuses every key it does not declare."""

    keys: dict[Annotated[str, Field(pattern=CONFIG_KEY_PATTERN)], ConfigKey] = Field(
        default_factory=dict,
        max_length=256,
        description=(
            "Key name (a ConfigMap key, or a glob with * and ? for a family such as service_*.conf) -> "
            "declaration. A glob key cannot be required or have a default."
        ),
    )

    @model_validator(mode="after")
    def _globs_plain(self) -> ConfigSpec:
        for name, key in self.keys.items():
            if is_glob(name) and (key.required or key.default is not None):
                raise ValueError(f"keys.{name}: a glob key can be neither required nor have a default")
        return self

    def declaration(self, name: str) -> ConfigKey | None:
        """The declaration a given key falls under: its own name first, then the first glob matching it."""
        if name in self.keys and not is_glob(name):
            return self.keys[name]
        return next((key for pattern, key in self.keys.items() if is_glob(pattern)
                     and fnmatch.fnmatchcase(name, pattern)), None)
