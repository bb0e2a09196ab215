from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trainer.fault_tolerance.live import step_rank
from trainer.sampler import GlobalSampler


def run_epoch(sampler: GlobalSampler, plan: list[tuple[int, bool]]) -> Counter[int]:
    """Drive one epoch: each plan entry is (participants, commit?); returns committed ids."""
    used: Counter[int] = Counter()
    epoch = sampler.epoch
    step = 0
    while sampler.epoch == epoch:
        participants, commit = plan[step % len(plan)]
        step += 1
        shares = [sampler.assign(rank, participants) for rank in range(participants)]
        assert len({(s.epoch, s.cursor, s.window) for s in shares}) == 1
        if commit:
            for share in shares:
                used.update(share.indices.tolist())
            sampler.commit(shares[0])
    return used


@pytest.mark.parametrize("participants", [1, 2, 3])
def test_every_sample_once_per_epoch(participants: int) -> None:
    sampler = GlobalSampler(num_samples=101, batch_size=4, seed=1)
    for _ in range(2):
        used = run_epoch(sampler, [(participants, True)])
        assert used == Counter(range(101))


def test_aborted_steps_are_redone_not_skipped() -> None:
    sampler = GlobalSampler(num_samples=50, batch_size=3, seed=0)
    aborted = sampler.assign(0, 2)
    again = sampler.assign(0, 2)
    np.testing.assert_array_equal(aborted.indices, again.indices)
    used = run_epoch(sampler, [(2, False), (2, True), (3, False), (1, True)])
    assert used == Counter(range(50))


@settings(max_examples=60, deadline=None)
@given(num_samples=st.integers(1, 80), batch_size=st.integers(1, 7),
       plan=st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=12)
       .filter(lambda p: any(commit for _, commit in p)))
def test_membership_changes_keep_exactly_once(num_samples: int, batch_size: int,
                                              plan: list[tuple[int, bool]]) -> None:
    sampler = GlobalSampler(num_samples, batch_size, seed=3)
    assert run_epoch(sampler, plan) == Counter(range(num_samples))
    assert (sampler.epoch, sampler.cursor) == (1, 0)


def test_order_is_deterministic_per_epoch_and_differs_between_epochs() -> None:
    a, b = GlobalSampler(30, 2, seed=5), GlobalSampler(30, 2, seed=5)
    np.testing.assert_array_equal(a.order(0), b.order(0))
    assert not np.array_equal(a.order(0), a.order(1))
    assert not np.array_equal(a.order(0), GlobalSampler(30, 2, seed=6).order(0))


def test_stale_commit_and_mismatched_state_are_refused() -> None:
    sampler = GlobalSampler(10, 2, seed=0)
    first = sampler.assign(0, 1)
    sampler.commit(first)
    with pytest.raises(ValueError, match="stale"):
        sampler.commit(first)
    with pytest.raises(ValueError, match="samples"):
        GlobalSampler(11, 2, seed=0).load_state_dict(sampler.state_dict())


def test_state_round_trip_resumes_at_the_cursor() -> None:
    sampler = GlobalSampler(20, 3, seed=2)
    sampler.commit(sampler.assign(0, 2))
    restored = GlobalSampler(20, 3, seed=2)
    restored.load_state_dict(sampler.state_dict())
    np.testing.assert_array_equal(restored.assign(1, 2).indices, sampler.assign(1, 2).indices)
    assert restored.cursor == 6


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=6).filter(lambda h: not all(h)),
       st.integers(1, 12))
@example(healing=[True, False], shards=3)  # pod 0 of two migrated, three shards
def test_a_healing_participant_takes_a_smallest_run_whatever_its_replica_id(
        healing: list[bool], shards: int) -> None:
    """A live step's participants, in torchft's (replica id) order, some up to date and some
    healing: their step ranks hand out every shard once, and a lone healer gets one of the
    smallest runs, wherever its replica id sorts."""
    participants = len(healing)
    up_to_date = [r for r, heals in enumerate(healing) if not heals]
    ranks = [step_rank(r, participants, len(up_to_date), None if heals else up_to_date.index(r))
             for r, heals in enumerate(healing)]
    assert sorted(ranks) == list(range(participants))
    sampler = GlobalSampler(num_samples=1000, batch_size=4, seed=0, global_batch=4 * shards)
    shares = [sampler.assign(rank, participants) for rank in ranks]
    assert shares[0].window_ids is not None
    assert sorted(np.concatenate([s.indices for s in shares])) == sorted(shares[0].window_ids)
    if healing.count(True) == 1:
        healer = shares[healing.index(True)]
        assert len(healer.shards) == min(len(s.shards) for s in shares)
