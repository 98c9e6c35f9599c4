"""Error types. Each carries a one-line, user-facing message naming what is wrong."""

from __future__ import annotations


class TopasError(Exception):
    """Base class: any error whose message is meant for the user as-is."""


class WorkflowError(TopasError, ValueError):
    """A workflow definition is invalid (bad field, cycle, unknown agent/dep)."""


class LabelError(TopasError, ValueError):
    """A request label is malformed. `field` names the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"topas label field '{field}': {problem}")
        self.field = field
        self.problem = problem


class DecisionError(TopasError, RuntimeError):
    """A policy returned a Decision the engine cannot apply (a policy bug)."""


class ConfigError(TopasError, ValueError):
    """A profile, policy option or CLI argument is invalid."""
