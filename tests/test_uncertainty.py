"""Bootstrap intervals of Recall@K (hnclip.evaluation.bootstrap) on cases with known answers, and the
per-query ranks recall_at_k now returns (what the intervals resample)."""
import math

import numpy as np
import pytest
import torch

from hnclip.evaluation.bootstrap import (
    Bootstrap,
    BootstrapSettings,
    outcomes,
    paired_contrast_interval,
    recall_interval,
)
from hnclip.evaluation.retrieval import ranks_of_positives, recall_at_k

SETTINGS = BootstrapSettings(resamples=2000, seed=0, confidence=0.95)


def test_all_correct_queries_give_a_degenerate_interval():
    assert recall_interval([0] * 300, k=1, settings=SETTINGS) == (100.0, 100.0, 100.0)
    assert recall_interval([7] * 300, k=5, settings=SETTINGS) == (0.0, 0.0, 0.0)


def test_half_correct_interval_has_the_binomial_width():
    n = 2000
    ranks = [0, 3] * (n // 2)  # exactly half the ground truths at rank 0
    value, low, high = recall_interval(ranks, k=1, settings=SETTINGS)
    expected_half_width = 1.96 * math.sqrt(0.25 / n) * 100  # 2.19 points
    assert value == 50.0
    assert low < 50 < high
    assert (high - low) / 2 == pytest.approx(expected_half_width, rel=0.12)
    assert abs((50 - low) - (high - 50)) < 0.5  # symmetric around the estimate


def test_identical_runs_have_a_zero_paired_contrast():
    ranks = list(np.random.default_rng(1).integers(0, 20, size=500))
    assert paired_contrast_interval(ranks, ranks, k=5, settings=SETTINGS) == (0.0, 0.0, 0.0)


def test_a_shifted_run_has_a_positive_paired_contrast_narrower_than_unpaired():
    rng = np.random.default_rng(2)
    base = rng.integers(0, 10, size=1000)
    better = np.where(rng.random(1000) < 0.15, 0, base)  # 15 % of the queries moved to rank 0
    value, low, high = paired_contrast_interval(better.tolist(), base.tolist(), k=1, settings=SETTINGS)
    assert value == pytest.approx(((better < 1).mean() - (base < 1).mean()) * 100)
    assert 0 < low < value < high
    # pairing keeps the queries both runs get right out of the difference: narrower than resampling the
    # two runs' queries independently (as if on two test sets)
    boot = Bootstrap(SETTINGS)
    unpaired = boot.replicates(outcomes([better], 1, "a", (0,))) - boot.replicates(outcomes([base], 1, "b", (0,)))
    unpaired_low, unpaired_high = boot.interval(unpaired)
    assert high - low < 0.8 * (unpaired_high - unpaired_low)


def test_seeds_are_resampled_too():
    boot = Bootstrap(SETTINGS)
    cell = outcomes([[0] * 100, [9] * 100], k=1, test_set="docci", seeds=(42, 43))  # 100 % and 0 %
    replicates = boot.replicates(cell)
    assert cell.value == 50.0
    assert set(np.unique(replicates)) == {0.0, 50.0, 100.0}  # both seeds drawn twice, or once each
    assert boot.interval(replicates) == (0.0, 100.0)


def test_cells_on_one_test_set_share_their_query_resamples():
    boot = Bootstrap(SETTINGS)
    ranks = np.random.default_rng(3).integers(0, 4, size=400).tolist()
    a = boot.replicates(outcomes([ranks], 1, "dci", (42,)))
    b = boot.replicates(outcomes([ranks], 1, "dci", (42,)))
    other = boot.replicates(outcomes([ranks], 1, "docci", (42,)))
    assert np.array_equal(a, b)  # same queries, same draws: a paired bootstrap by construction
    assert not np.array_equal(a, other)
    again = Bootstrap(SETTINGS).replicates(outcomes([ranks], 1, "dci", (42,)))
    assert np.array_equal(a, again)  # fixed seed: reproducible
    reseeded = Bootstrap(BootstrapSettings(resamples=2000, seed=1)).replicates(outcomes([ranks], 1, "dci", (42,)))
    assert not np.array_equal(a, reseeded)


def test_settings_come_from_params_with_defaults():
    assert BootstrapSettings.from_params({}) == BootstrapSettings(1000, 0, 0.95)
    assert BootstrapSettings.from_params({"bootstrap": {"resamples": 50}}).resamples == 50


def test_recall_at_k_returns_the_rank_of_every_query():
    torch.manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(40, 8), dim=-1)
    txt = torch.nn.functional.normalize(img + 0.8 * torch.randn(40, 8), dim=-1)
    result = recall_at_k(img, txt, ks=(1, 5), tie_rule="pessimistic")
    sims = img @ txt.t()
    for direction, scores in (("t2i", sims.t()), ("i2t", sims)):
        ranks = result["ranks"][direction]
        assert len(ranks) == 40 and all(isinstance(r, int) for r in ranks)
        assert ranks == ranks_of_positives(scores, "pessimistic")[0].tolist()
        for k in (1, 5):
            assert result[direction][f"R@{k}"] == pytest.approx(np.mean(np.array(ranks) < k) * 100)
    assert {"n", "tie_rule", "ties", "t2i", "i2t"} <= result.keys()
