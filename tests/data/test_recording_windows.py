import pytest
import torch
from torch.utils.data import DataLoader

from ignite_tbptt import create_tbptt_trainer, masked_loss
from ignite_tbptt.data import RecordingWindows, recording_columns

from ..reference import Net

masked_mse = masked_loss(torch.nn.functional.mse_loss)


def recordings(lengths=(30, 7, 18), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, 3, generator=g, dtype=torch.float64), torch.randn(n, 4, generator=g, dtype=torch.float64))
        for n in lengths
    ]


def test_windows_start_at_every_stride_of_every_recording_long_enough():
    data = recordings()
    windows = RecordingWindows(data, length=10, stride=4)
    # 30 steps: starts 0, 4, ..., 20 (6); 7 steps: none; 18 steps: 0, 4, 8 (3).
    assert len(windows) == 9
    x, y = windows[7]  # the second window of the third recording
    assert torch.equal(x, data[2][0][4:14]) and torch.equal(y, data[2][1][4:14])
    assert len(RecordingWindows(data, length=10)) == 21 + 9  # every step


def test_windows_at_random_places_are_drawn_afresh_each_epoch_from_the_seed():
    data = recordings()
    windows = RecordingWindows(data, length=10, count=50, seed=3)
    first = [windows[i] for i in range(len(windows))]
    again = RecordingWindows(data, length=10, count=50, seed=3)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, (again[i] for i in range(50))))
    windows.set_epoch(1)
    assert not all(torch.equal(a[0], windows[i][0]) for i, a in enumerate(first))
    # Every window is a run of 10 steps of one recording, wherever it falls (the 7-step one never).
    for x, _ in (windows[i] for i in range(50)):
        assert x.shape == (10, 3)
        assert any(
            (x.unsqueeze(0) == r.unfold(0, 10, 1).permute(0, 2, 1)).all((1, 2)).any() for r, _ in data if len(r) >= 10
        )


def test_a_loader_of_windows_trains_with_a_burn_in_as_the_same_windows_time_first():
    # Batch-first windows (time_dim=1): the burn-in masks the same targets as on time-first batches.
    windows = RecordingWindows(recordings(), length=12, stride=5)
    loader = DataLoader(windows, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(0))
    batches = list(loader)

    def trained(data, time_dim):
        torch.manual_seed(0)
        model = Net(batch_first=time_dim == 1).double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        create_tbptt_trainer(model, optimizer, masked_mse, 6, 9, time_dim=time_dim, burn_in=4).run(data, max_epochs=2)
        return model

    batch_first = trained(batches, 1)
    time_first = trained([(x.transpose(0, 1), y.transpose(0, 1)) for x, y in batches], 0)
    for p, q in zip(batch_first.parameters(), time_first.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


def test_collate_stacks_windows_time_first():
    windows = RecordingWindows(recordings(), length=12, stride=5)
    x, y = next(iter(DataLoader(windows, batch_size=3, collate_fn=RecordingWindows.collate)))
    assert x.shape == (12, 3, 3) and y.shape == (12, 3, 4)
    assert torch.equal(x[:, 1], windows[1][0]) and torch.equal(y[:, 2], windows[2][1])


def test_recording_columns_continue_each_column_from_batch_to_batch():
    x, y = recordings(lengths=(23,))[0]
    batches = recording_columns(x, y, batch_size=2, length=4)
    # 11 steps a column (a step dropped): batches of 4, 4 and 3 steps.
    assert [b[0].shape for b in batches] == [(4, 2, 3), (4, 2, 3), (3, 2, 3)]
    joined = torch.cat([b[0] for b in batches])  # (11, 2, 3)
    assert torch.equal(joined[:, 0], x[:11]) and torch.equal(joined[:, 1], x[11:22])
    assert torch.equal(torch.cat([b[1] for b in batches])[:, 1], y[11:22])


def test_bad_recordings_are_named():
    with pytest.raises(ValueError, match=r"no recording is 40 steps long \(the longest has 30\)"):
        RecordingWindows(recordings(), length=40)
    with pytest.raises(ValueError, match=r"recording 1: x and y must have as many steps"):
        RecordingWindows([recordings()[0], (torch.zeros(5, 1), torch.zeros(4, 1))], length=3)
    with pytest.raises(TypeError, match=r"recording 0 must be a pair"):
        RecordingWindows([torch.zeros(5)], length=3)
    with pytest.raises(ValueError, match=r"cannot fill 9 columns"):
        recording_columns(torch.zeros(5, 1), torch.zeros(5, 1), batch_size=9, length=2)
