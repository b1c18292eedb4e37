"""Hidden-state trees: the shortcuts for nn.RNN, nn.GRU and nn.LSTM states agree with the general tree walk."""

import pytest
import torch

from ignite_tbptt.runtime import hidden as hs

H = torch.zeros(1, 2, 3)
TREES = [H, (H, H), (H, H.double()), (H,), [H, H], {"h": H}, (H, torch.zeros(1, 3, 3))]


@pytest.mark.parametrize("a", TREES, ids=range(len(TREES)))
@pytest.mark.parametrize("b", TREES, ids=range(len(TREES)))
def test_interchangeable_is_equal_signatures(a, b):
    assert hs.interchangeable(a, b) == (hs.signature(a) == hs.signature(b))


@pytest.mark.parametrize("tree", TREES, ids=range(len(TREES)))
@pytest.mark.parametrize("requires_grad", [False, True])
def test_as_leaves_keeps_the_nesting_and_detaches(tree, requires_grad):
    new, leaves = hs.as_leaves(tree, requires_grad)
    assert hs.signature(new) == hs.signature(tree)
    flat = hs.flatten(new)
    assert len(leaves) == len(flat) and all(a is b for a, b in zip(leaves, flat))
    assert all(t.is_leaf and t.requires_grad == requires_grad for t in leaves)
