"""TaskTracker's JCT take-back: a task concluded by inference that is reopened by a late call,
or that the client then says failed, loses its JCT the same way on both paths."""

from __future__ import annotations

import pytest

from topas_agents.task_tracker import TaskTracker
from topas_agents.workflow import load_workflow


def _concluded_by_inference() -> TaskTracker:
    """A tracker where task 'c' (chain3, 0 s to 4 s) concluded when its last stage's call
    ended, beside task 'u' (unlabelled, JCT 2 s), and every conclusion was reported."""
    tr = TaskTracker(idle_timeout_s=10.0, max_history=100)
    concluded: list[str] = []
    tr.on_conclude = lambda task: concluded.append(task.task_id)
    tr.commit_call("u", "default", None, None, True, 0.0, 0.0)
    tr.end_call("u", "default", True, 2.0, 2.0)
    wf = load_workflow("chain3")
    for stage in ("s1", "s2", "s3"):
        tr.commit_call("c", stage, wf, "chain3", False, 0.0, 0.0)
        tr.end_call("c", stage, True, 4.0, 4.0)
    assert tr.finished["c"].done_reason == "workflow" and concluded == ["u", "c"]
    assert (tr.jct_count, tr.jct_sum, tr.reopens_total) == (2, 6.0, 0)
    return tr


@pytest.mark.parametrize("take_back", ["reopened by a call", "failed by the client"])
def test_a_concluded_tasks_jct_is_taken_back_alike_on_both_paths(take_back: str) -> None:
    tr = _concluded_by_inference()
    if take_back == "reopened by a call":
        tr.commit_call("c", "s3", load_workflow("chain3"), "chain3", False, 5.0, 5.0)
        assert "c" in tr.active and tr.active["c"].reopened == 1
    else:
        assert tr.task_done("c", 5.0, 5.0, failed=True) == []
        assert (tr.finished["c"].done_reason, tr.finished["c"].jct_s, tr.failed) == ("failed", None, 1)
    # c's 4 s are out of the count, the sum and the recent JCTs (stats' percentiles); u's stay
    assert (tr.jct_count, tr.jct_sum) == (1, 2.0)
    assert [(j.task_id, j.jct_s) for j in tr.jcts] == [("u", 2.0)]
    # the histogram observed 2 conclusions and never goes down: the take-back is a reopen
    assert tr.reopens_total == 1 and 2 - tr.reopens_total == tr.jct_count


def test_a_failed_done_call_after_the_clients_own_done_call_changes_nothing() -> None:
    """A task id used again: the second run's calls are refused (409, the task was closed), and
    its `task()` block ends with a failed done call. The first run's own done call stands: its
    JCT is kept and nothing is counted failed (the failed call used to take the JCT back)."""
    tr = TaskTracker(idle_timeout_s=10.0, max_history=100)
    tr.commit_call("t", "s", None, None, True, 0.0, 0.0)
    tr.end_call("t", "s", True, 3.0, 3.0)
    tr.task_done("t", 6.0, 6.0)
    done = tr.finished["t"]
    before = (done.done_reason, done.jct_s, tr.jct_count, tr.jct_sum, tr.failed, tr.reopens_total)
    assert done.done_reason == "explicit" and done.jct_s is not None
    assert tr.task_done("t", 9.0, 9.0, failed=True) == []
    assert (done.done_reason, done.jct_s, tr.jct_count, tr.jct_sum, tr.failed, tr.reopens_total) == before
