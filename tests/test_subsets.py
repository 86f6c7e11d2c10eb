"""Data-fraction subsets: fixed seed, nested, identical for every method and run seed."""
import pytest
import torch

from hnclip.data.loader import subset_indices


def test_subsets_are_nested_and_sized():
    n = 512
    sizes = {f: subset_indices(n, f) for f in (0.05, 0.2, 0.5, 1.0)}
    assert [len(v) for v in sizes.values()] == [26, 103, 256, 512]
    assert set(sizes[0.05]) < set(sizes[0.2]) < set(sizes[0.5]) < set(sizes[1.0]) == set(range(n))


def test_subsets_do_not_depend_on_anything_but_the_subset_seed():
    """Runs seed the global generators (run seed 42 or 43) and draw from them before the data is
    subset: the subset must come out the same anyway, and leave the global stream untouched."""
    torch.manual_seed(42)
    first = subset_indices(1000, 0.2)
    torch.manual_seed(43)
    torch.rand(100)
    state = torch.get_rng_state()
    assert subset_indices(1000, 0.2) == first
    assert torch.equal(torch.get_rng_state(), state)
    assert subset_indices(1000, 0.2, subset_seed=1) != first
    # pinned: the same subsets in every process, on every machine, for as long as results are compared
    assert subset_indices(10, 0.3) == [1, 4, 7] and subset_indices(10, 0.3, subset_seed=1) == [1, 5, 6]


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5])
def test_fraction_outside_unit_interval_is_rejected(fraction):
    with pytest.raises(ValueError, match="fraction"):
        subset_indices(10, fraction)
