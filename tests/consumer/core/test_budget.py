from __future__ import annotations

from consumer.core.budget import BudgetDecision, GroupBudget, OverBudget

P0 = ("events", 0)
P1 = ("events", 1)
P2 = ("events", 2)


def test_below_the_pause_mark_nothing_happens() -> None:
    budget = GroupBudget(100, "pause")
    assert budget.check(79, [P0, P1]) == BudgetDecision()
    assert budget.paused == set()


def test_partitions_ahead_are_paused_at_80_percent_once() -> None:
    budget = GroupBudget(100, "pause")
    assert budget.check(80, [P1, P0]) == BudgetDecision(pause=[P0, P1])
    assert budget.check(85, [P0, P1, P2]) == BudgetDecision(pause=[P2])
    assert budget.check(90, [P0, P1, P2]) == BudgetDecision()
    assert budget.paused == {P0, P1, P2}


def test_they_resume_below_half_of_the_budget() -> None:
    budget = GroupBudget(100, "pause")
    budget.check(80, [P0])
    assert budget.check(50, []) == BudgetDecision()  # still paused: not below half yet
    assert budget.check(49, []) == BudgetDecision(resume=[P0])
    assert budget.paused == set()


def test_the_budget_itself_is_a_hard_bound_whatever_the_policy() -> None:
    policies: tuple[OverBudget, ...] = ("pause", "emit_early")
    for policy in policies:
        budget = GroupBudget(100, policy)
        assert budget.check(100, [P0]) == BudgetDecision(emit_early=True)


def test_emit_early_never_pauses() -> None:
    budget = GroupBudget(100, "emit_early")
    assert budget.check(99, [P0]) == BudgetDecision()


def test_revoked_partitions_are_forgotten_and_a_rewind_releases_the_rest() -> None:
    budget = GroupBudget(100, "pause")
    budget.check(90, [P0, P1])
    budget.forget([P0])
    assert budget.release_all() == [P1]
    assert budget.paused == set()
