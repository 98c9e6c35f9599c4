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


class TaskError(TopasError, ValueError):
    """A call or completion conflicts with what the task tracker knows about a task.

    Raised by `topas_agents.task_tracker`; a server maps each subclass to its own status.
    """


class UnknownTaskError(TaskError, LookupError):
    """A completion names a task the tracker has never seen (or has forgotten)."""


class UnknownStageError(TaskError):
    """A completion names a stage the task's registered workflow does not have."""


class TaskClosedError(TaskError):
    """A call for a task the client already marked done (task ids are not reusable)."""


class TaskWorkflowMismatchError(TaskError):
    """A call labels a known task with a different workflow than its first call did."""
