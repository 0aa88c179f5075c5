"""The run's attempt numbers from its launches' (services/analysis/attempt_numbers.py): worked examples, and random
multi-node jobs relaunched on other machines whose rounds the numbering must find."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.analysis.attempt_numbers import SAME_ROUND_S, LaunchAttempt, number_attempts


def la(launch: str, attempt: int, start: float, ranks: range | None = None, world: int | None = None) -> LaunchAttempt:
    return LaunchAttempt(launch=launch, attempt=attempt, start=start, world_size=world,
                         rank_lo=ranks.start if ranks else None, rank_hi=ranks.stop - 1 if ranks else None)


def test_a_relaunch_on_a_fresh_spool_comes_after_the_first_launch() -> None:
    numbers = number_attempts([la("host-b", 0, 500.0, range(1), 1), la("host-a", 0, 0.0, range(1), 1),
                               la("host-a", 1, 100.0, range(1), 1)])
    assert numbers == {("host-a", 0): 0, ("host-a", 1): 1, ("host-b", 0): 2}


def test_numbers_that_already_increase_with_time_are_kept() -> None:
    """One host and its spool: a relaunch continues after the earlier launch (base 2); a requeue's base leaves a
    gap (GOODPUT_ATTEMPT_BASE); both are kept."""
    numbers = number_attempts([la("l1", 0, 0.0, range(2), 2), la("l1", 1, 50.0, range(2), 2),
                               la("l2", 2, 200.0, range(2), 2), la("l3", 6, 900.0, range(2), 2)])
    assert numbers == {("l1", 0): 0, ("l1", 1): 1, ("l2", 2): 2, ("l3", 6): 6}


def test_the_nodes_of_one_round_share_a_number_even_when_their_spools_disagree() -> None:
    """Node a's spool saw an earlier launch (it numbers from 3), node b's is fresh: one attempt, numbered 3."""
    numbers = number_attempts([la("a", 3, 100.0, range(0, 8), 16), la("b", 0, 100.6, range(8, 16), 16),
                               la("a", 4, 180.0, range(0, 8), 16), la("b", 1, 180.2, range(8, 16), 16)])
    assert numbers == {("a", 3): 3, ("b", 0): 3, ("a", 4): 4, ("b", 1): 4}


def test_a_node_whose_clock_is_ahead_pairs_with_its_own_round() -> None:
    """Node b's clock is 40 s ahead and rounds are 20 s apart: b's round 0 starts, by its clock, closer to a's
    round 1; the launches' own round numbers pair them right."""
    numbers = number_attempts([la("a", 0, 0.0, range(0, 2), 4), la("a", 1, 20.0, range(0, 2), 4),
                               la("b", 0, 40.0, range(2, 4), 4), la("b", 1, 60.0, range(2, 4), 4)])
    assert numbers == {("a", 0): 0, ("b", 0): 0, ("a", 1): 1, ("b", 1): 1}


def test_a_replacement_node_joins_the_round_it_started_in() -> None:
    """An elastic job's node c replaces node b in round 2: c numbers that round 0; it is the run's round 2."""
    numbers = number_attempts([la("a", 0, 0.0, range(0, 2), 4), la("b", 0, 0.3, range(2, 4), 4),
                               la("a", 1, 30.0, range(0, 2), 4), la("b", 1, 30.1, range(2, 4), 4),
                               la("a", 2, 90.0, range(0, 2), 4), la("c", 0, 90.5, range(2, 4), 4)])
    assert numbers[("c", 0)] == numbers[("a", 2)] == 2


def test_a_relaunch_soon_after_a_short_round_is_not_taken_for_its_missing_node() -> None:
    """Only node a of launch 1 reported its round; launch 2 starts 5 s later on nodes c and d. Node c has a's
    ranks, so c and d form their own round: two attempts."""
    numbers = number_attempts([la("a", 0, 0.0, range(0, 2), 4), la("c", 0, 5.0, range(0, 2), 4),
                               la("d", 0, 5.2, range(2, 4), 4)])
    assert numbers == {("a", 0): 0, ("c", 0): 1, ("d", 0): 1}


def test_records_without_a_launch_keep_their_numbers_and_launches_go_around_them() -> None:
    numbers = number_attempts([la("", 0, 0.0), la("", 1, 100.0), la("new", 0, 50.0, range(1), 1),
                               la("newer", 0, 300.0, range(1), 1)])
    assert numbers[("", 0)] == 0 and numbers[("", 1)] == 1
    assert numbers[("new", 0)] == 2 and numbers[("newer", 0)] == 3  # never a number the old clients took


@st.composite
def relaunched_jobs(draw: st.DrawFn) -> tuple[list[LaunchAttempt], list[list[tuple[str, int]]]]:
    """Launches of one run, one after the other, each on its own nodes (fresh names, bases drawn per node: fresh
    spools or not), several rounds each; nodes start a round within 2 s of each other, plus a clock skew per
    node (up to 10 s). Returns the launch attempts and, per true round in order, its members."""
    attempts: list[LaunchAttempt] = []
    rounds: list[list[tuple[str, int]]] = []
    t = 0.0
    node_names = 0
    for _ in range(draw(st.integers(1, 4))):
        nodes = draw(st.integers(1, 4))
        per_node = draw(st.integers(1, 3))
        world = nodes * per_node
        names = [f"n{node_names + i}" for i in range(nodes)]
        node_names += nodes
        bases = [draw(st.integers(0, 3)) for _ in names]
        skews = [draw(st.floats(-10.0, 10.0)) for _ in names]
        for r in range(draw(st.integers(1, 3))):
            members = []
            for i, name in enumerate(names):
                start = t + draw(st.floats(0.0, 2.0)) + skews[i]
                attempts.append(la(name, bases[i] + r, start, range(i * per_node, (i + 1) * per_node), world))
                members.append((name, bases[i] + r))
            rounds.append(members)
            t += draw(st.floats(25.0, 2 * SAME_ROUND_S))
        t += draw(st.floats(25.0, 600.0))
    return attempts, rounds


@settings(max_examples=300, deadline=None)
@given(relaunched_jobs())
def test_random_relaunched_jobs_get_one_increasing_number_per_round(
        job: tuple[list[LaunchAttempt], list[list[tuple[str, int]]]]) -> None:
    attempts, rounds = job
    numbers = number_attempts(attempts)
    per_round = [{numbers[key] for key in members} for members in rounds]
    assert all(len(n) == 1 for n in per_round), per_round
    ordered = [n.pop() for n in per_round]
    assert ordered == sorted(set(ordered)), ordered  # distinct, in the rounds' order
    assert number_attempts(reversed(attempts)) == numbers
