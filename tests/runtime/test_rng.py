"""Random-state replay: a recomputed segment draws the same dropout, and the generator goes on untouched."""

import torch

from ignite_tbptt.runtime import rng


def test_replay_draws_the_same_numbers_and_leaves_the_generator_where_it_was(device):
    torch.manual_seed(3)
    state = rng.capture(device)
    first = torch.rand(5)
    following = torch.rand(5)

    torch.manual_seed(3)
    torch.rand(5)  # the forward pass
    with rng.restored(state, device):
        replayed = torch.rand(5)  # its recomputation
    torch.testing.assert_close(replayed, first, rtol=0, atol=0)
    torch.testing.assert_close(torch.rand(5), following, rtol=0, atol=0)  # as if nothing was replayed


def test_replayed_dropout_masks_match(device):
    dropout = torch.nn.Dropout(0.5)
    x = torch.ones(100)  # on the --device: its generator draws the masks
    state = rng.capture(device)
    mask = dropout(x)
    with rng.restored(state, device):
        again = dropout(x)
    assert torch.equal(mask, again) and not torch.equal(mask, dropout(x))
