"""The one backoff rule: pauses double from the first to the cap, and a
success starts them over."""

from __future__ import annotations

from django_cogworker.backoff import Backoff


def test_pauses_double_from_the_first_up_to_the_cap_and_stay_there():
    pauses = Backoff(max_s=1.0, first_s=0.1)
    assert [round(pauses.next_s(), 3) for _ in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def test_a_long_outage_never_overflows():
    pauses = Backoff(max_s=5.0)
    for _ in range(100_000):
        pauses.next_s()
    assert pauses.next_s() == 5.0


def test_reset_starts_over_and_says_whether_it_ended_a_run_of_failures():
    pauses = Backoff(max_s=5.0)
    assert pauses.reset() is False  # nothing failed: no outage ended
    pauses.next_s()
    pauses.next_s()
    assert pauses.reset() is True
    assert pauses.next_s() == 0.1
