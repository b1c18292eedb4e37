"""Weight versions: retained graphs backpropagate with the weights they ran with, across in-place steps."""

import pytest
import torch

from ignite_tbptt.runtime import ParameterVersions


def test_graphs_recorded_before_a_freeze_see_the_old_weights_and_later_ones_the_new():
    linear = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 2.0]]))
    versions = ParameterVersions(linear.parameters)
    x = torch.tensor([[3.0, 4.0]], requires_grad=True)
    with versions.hooks():
        before = linear(x).sum()
    old = versions.current
    versions.freeze()
    with torch.no_grad():
        linear.weight.mul_(10.0)  # the optimizer step, in place
    with versions.hooks():
        after = linear(x).sum()
    before.backward()
    torch.testing.assert_close(x.grad, torch.tensor([[1.0, 2.0]]))
    x.grad = None
    after.backward()
    torch.testing.assert_close(x.grad, torch.tensor([[10.0, 20.0]]))
    assert old.frozen and not versions.current.frozen
    torch.testing.assert_close(versions.values(old)[0], torch.tensor([[1.0, 2.0]]))
    torch.testing.assert_close(versions.values(versions.current)[0], linear.weight.detach())


def test_a_freeze_copies_each_parameter_once_and_graphs_share_the_copy():
    linear = torch.nn.Linear(3, 3)
    versions = ParameterVersions(linear.parameters)
    with versions.hooks():
        outs = [linear(torch.randn(2, 3)).sum() for _ in range(4)]
    version = versions.current
    versions.freeze()
    assert len(version.copies) == 2  # weight and bias, whatever the number of graphs that saved them
    for out in outs:
        out.backward()


@pytest.mark.parametrize("frozen", [False, True])
def test_in_place_change_of_a_saved_activation_under_the_weight_hooks_still_raises(frozen):
    # Saved-tensor hooks switch off autograd's own version check; the hooks of k2 > k1 histories keep it.
    linear = torch.nn.Linear(2, 2)
    versions = ParameterVersions(linear.parameters)
    with versions.hooks():
        out = torch.tanh(linear(torch.randn(3, 2)))  # tanh saves its output
    if frozen:
        versions.freeze()
    out.mul_(2)
    with pytest.raises(
        RuntimeError, match=r"computed by the model or handed to it as its hidden state \(not a parameter\)"
    ):
        out.sum().backward()
