"""RandomSearch: no repeats, respects `valid`, and runs out cleanly."""

from __future__ import annotations

from tuner.search import RandomSearch


def test_random_search_draws_only_valid_configs_and_never_repeats() -> None:
    s = RandomSearch(40, seed=1, valid=lambda i: i % 3 == 0)
    got: list[int] = []
    for _ in range(10):
        got += s.ask(4)
    assert all(i % 3 == 0 for i in got)
    assert len(got) == len(set(got)) == 14  # 0, 3, ..., 39: every valid config, then none
    assert s.ask(4) == []


def test_random_search_tell_of_unasked_indices_excludes_them() -> None:
    s = RandomSearch(10, seed=0)
    s.tell([1, 2, 3], [])
    got = s.ask(10)
    assert sorted(got) == [0, 4, 5, 6, 7, 8, 9]
