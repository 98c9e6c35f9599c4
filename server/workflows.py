"""Workflows registered with the server (`--workflow`, `POST /v1/topas/workflows`).

The registry's mapping is handed to the engine at construction and only ever grows, so the
engine sees later registrations without copying.
"""

from __future__ import annotations

from collections.abc import Mapping

import yaml

from ..errors import WorkflowError
from ..workflow import Workflow, builtin_workflows, load_workflow, parse_workflow, yaml_error_detail
from .api_errors import ApiError, bad_request


class WorkflowRegistry:
    def __init__(self) -> None:
        self._by_name: dict[str, Workflow] = {}

    @property
    def mapping(self) -> Mapping[str, Workflow]:
        """The live name -> Workflow mapping (shared with the engine)."""
        return self._by_name

    def __bool__(self) -> bool:
        return bool(self._by_name)

    def get(self, name: str) -> Workflow | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def add(self, wf: Workflow) -> bool:
        """Register `wf`; True if new. Re-registering an identical definition is a no-op;
        a different definition under a registered name is a 409 (running tasks use it)."""
        old = self._by_name.get(wf.name)
        if old is not None:
            if old == wf:
                return False
            raise ApiError(409, f"workflow '{wf.name}' is already registered with a different definition",
                           "name")
        self._by_name[wf.name] = wf
        return True

    def load(self, name_or_path: str) -> Workflow:
        """CLI `--workflow NAME|PATH.yaml` (raises WorkflowError, a one-line user error)."""
        wf = load_workflow(name_or_path)
        if self._by_name.get(wf.name, wf) != wf:
            raise WorkflowError(f"two different workflows named '{wf.name}'")
        self._by_name[wf.name] = wf
        return wf

    def add_text(self, text: str) -> tuple[Workflow, bool]:
        """`POST /v1/topas/workflows` body: YAML or JSON (JSON is YAML), or the bare name of a
        built-in workflow (never a server-side path). 400 on any error."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise bad_request(f"invalid YAML/JSON{yaml_error_detail(exc)}") from None
        try:
            if isinstance(data, str) and data in builtin_workflows():  # a built-in by name
                wf = load_workflow(data)
            else:
                wf = parse_workflow(data, "workflow")
        except WorkflowError as exc:
            raise bad_request(str(exc)) from None
        return wf, self.add(wf)
