"""Length distributions and the step shapes a run draws from them (torch-free)."""

from __future__ import annotations

import json

import pytest

from memfit.errors import SpecError
from memfit.estimate.seqrun.dist import parse_seq_dist, step_lengths
from memfit.spec.seqrun import SeqDist, StepPlan
from memfit.userfiles import UserFileError


def test_mean_std_max_is_a_normal_clipped_to_the_limit() -> None:
    dist = parse_seq_dist("300,400,512")
    assert (dist.mean, dist.std, dist.max_len) == (300.0, 400.0, 512)
    lengths = step_lengths(dist, StepPlan(batch_size=1, n_steps=2000, seed=1))
    assert min(lengths) >= 1 and max(lengths) == 512
    # truncation puts the mass above the limit at the limit: P(x > 512) = P(z > 0.53) ~ 30 %
    assert 0.2 < lengths.count(512) / len(lengths) < 0.4


def test_a_mean_above_the_limit_is_refused() -> None:
    with pytest.raises(SpecError, match=r"mean \(600.0\) must be between 1 and max \(512\)"):
        parse_seq_dist("600,10,512")


def test_a_fractional_limit_is_refused() -> None:
    with pytest.raises(SpecError, match=r"max \(512.5\) must be a whole number"):
        parse_seq_dist("300,10,512.5")


def test_two_or_four_numbers_are_refused_as_a_mean_std_max_typo() -> None:
    for text, n in (("300,250", 2), ("300,250,1024,8", 4)):
        with pytest.raises(SpecError, match=rf"give three numbers MEAN,STD,MAX .*not {n}"):
            parse_seq_dist(text)


def test_histogram_json_and_csv_read_the_same(tmp_path) -> None:
    j = tmp_path / "lengths.json"
    j.write_text(json.dumps({"100": 3, "400": 1}))
    c = tmp_path / "lengths.csv"
    c.write_text("length,count\n100,3\n400,1\n")
    a, b = parse_seq_dist(str(j)), parse_seq_dist(str(c))
    assert a.lengths == b.lengths == (100, 400) and a.weights == b.weights == (3, 1)
    assert a.max_len == 400
    lengths = step_lengths(a, StepPlan(batch_size=1, n_steps=400, seed=0))
    assert set(lengths) == {100, 400} and 0.6 < lengths.count(100) / 400 < 0.9


def test_histogram_with_a_bad_row_names_the_entry(tmp_path) -> None:
    c = tmp_path / "lengths.csv"
    c.write_text("100,3\n400,abc\n")
    with pytest.raises(UserFileError, match=r"entry 2 .* is not a pair of whole numbers"):
        parse_seq_dist(str(c))


def test_a_missing_histogram_file_is_a_user_file_error(tmp_path) -> None:
    with pytest.raises(UserFileError, match="does not exist"):
        parse_seq_dist(str(tmp_path / "nope.json"))


def test_packing_fills_every_step_to_the_limit() -> None:
    dist = SeqDist(mean=100, std=50, max_len=1024)
    plan = StepPlan(batch_size=4, n_steps=50, packing=True)
    assert step_lengths(dist, plan) == [1024] * 50


def test_pad_to_multiple_rounds_each_batch_longest_up() -> None:
    dist = SeqDist(mean=100, std=50, max_len=1000)
    plain = step_lengths(dist, StepPlan(batch_size=4, n_steps=200, seed=3))
    padded = step_lengths(dist, StepPlan(batch_size=4, n_steps=200, seed=3, pad_to_multiple_of=64))
    assert all(p % 64 == 0 and p - 64 < n <= p for n, p in zip(plain, padded))
    assert len(set(padded)) < len(set(plain))


def test_group_by_length_puts_the_longest_step_first() -> None:
    dist = SeqDist(mean=200, std=100, max_len=2048)
    plan = StepPlan(batch_size=2, n_steps=300, seed=5, group_by_length=True)
    lengths = step_lengths(dist, plan)
    assert lengths[0] == max(lengths)
    assert len(lengths) == 300


def test_the_same_seed_draws_the_same_run() -> None:
    dist = SeqDist(mean=200, std=100, max_len=512)
    plan = StepPlan(batch_size=2, n_steps=100, seed=7)
    assert step_lengths(dist, plan) == step_lengths(dist, plan)
    assert step_lengths(dist, plan) != step_lengths(dist, StepPlan(batch_size=2, n_steps=100))


def test_step_plan_lists_every_problem() -> None:
    with pytest.raises(SpecError, match=r"batch_size \(0\).*n_steps \(0\).*pad_to_multiple_of"):
        StepPlan(batch_size=0, n_steps=0, pad_to_multiple_of=0)
