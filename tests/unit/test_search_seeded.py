"""SeededSearch: the given configs first, each once, then the inner searcher's, never a repeat."""

from __future__ import annotations

from tuner.search import RandomSearch, SeededSearch


def test_seeds_come_first_once_and_the_inner_never_repeats_them() -> None:
    search = SeededSearch(RandomSearch(20, seed=3), [7, 2, 7])
    first = search.ask(1)
    assert first == [7]
    rest = search.ask(19)
    assert rest[0] == 2
    asked = first + rest
    assert sorted(asked) == list(range(20))  # the whole space, each config once
    assert search.ask(5) == []


def test_resumed_configs_are_excluded_seeds_included() -> None:
    search = SeededSearch(RandomSearch(10, seed=1), [4, 5])
    search.exclude([4, 9])
    asked = search.ask(10)
    assert asked[0] == 5 and 4 not in asked and 9 not in asked
    assert len(asked) == 8


def test_an_inner_searcher_that_cannot_exclude_has_its_repeats_of_seeds_dropped() -> None:
    class Sequential:  # proposes 0, 1, 2, ... and knows nothing of exclusion
        def __init__(self) -> None:
            self.next = 0

        def ask(self, n: int) -> list[int]:
            out = list(range(self.next, min(self.next + n, 6)))
            self.next += len(out)
            return out

        def tell(self, indices: object, results: object) -> None:
            pass

    search = SeededSearch(Sequential(), [3, 1])
    assert search.ask(3) == [3, 1, 0]
    assert search.ask(10) == [2, 4, 5]
    assert search.ask(1) == []


def test_a_seed_told_before_it_is_asked_is_not_proposed() -> None:
    search = SeededSearch(RandomSearch(6, seed=0), [4, 1])
    search.tell([4], [])  # a resumed run's earlier measurement of the seed
    asked = search.ask(6)
    assert asked[0] == 1 and 4 not in asked
