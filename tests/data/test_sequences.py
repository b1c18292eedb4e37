"""pack_sequences: every token once and in order, columns as queues, lazy reading, lengths and shuffling."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ignite_tbptt.data import pack_sequences


def unpack(batches, ignore_index=-100):
    """The sequences of each column, read back from ``starts``, ``x`` and ``y``."""
    if not batches:
        return []
    x, y, starts = (torch.cat(parts) for parts in zip(*batches))
    columns = []
    for b in range(x.shape[1]):
        sequences = []
        for t in range(x.shape[0]):
            if starts[t, b]:
                sequences.append([x[t, b].item()])
            if y[t, b] != ignore_index:
                assert sequences, "a target before the column's first start"
                sequences[-1].append(y[t, b].item())
        columns.append(sequences)
    return columns


packing = dict(
    # At least one sequence of two tokens: with none there is nothing to pack, an error of its own (tested below).
    lengths=st.lists(st.integers(0, 30), max_size=12).filter(lambda lengths: any(n >= 2 for n in lengths)),
    batch_size=st.integers(1, 4),
    length=st.integers(1, 9),
    shuffle=st.booleans(),
)


def corpus(lengths):
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    return [torch.arange(int(a), int(a) + n) for a, n in zip(offsets, lengths)]


@settings(max_examples=200, deadline=None)
@given(**packing)
def test_every_token_once_in_order_per_sequence(lengths, batch_size, length, shuffle):
    sequences = corpus(lengths)
    packed = pack_sequences(sequences, batch_size, length, shuffle=shuffle, seed=3)
    batches = list(packed)
    assert len(batches) == len(packed)
    assert all(x.shape == y.shape == s.shape and x.shape[1] == batch_size for x, y, s in batches)
    assert all(x.shape[0] == length for x, _, _ in batches[:-1])
    found = sorted(tuple(s) for column in unpack(batches) for s in column)
    assert found == sorted(tuple(s.tolist()) for s in sequences if len(s) >= 2)


@settings(max_examples=200, deadline=None)
@given(**packing)
def test_drop_last_keeps_every_batch_full_and_cuts_only_ends(lengths, batch_size, length, shuffle):
    sequences = corpus(lengths)
    packed = pack_sequences(sequences, batch_size, length, shuffle=shuffle, seed=3, drop_last=True)
    batches = list(packed)
    assert len(batches) == len(packed)
    assert sum(x.shape[0] for x, _, _ in batches) == packed.steps  # what the main job counts without building
    assert all((y != -100).all() for _, y, _ in batches)
    whole = {s[0].item(): s.tolist() for s in sequences if len(s) >= 2}
    found = [s for column in unpack(batches) for s in column]
    assert len({s[0] for s in found}) == len(found)  # no sequence twice
    assert all(whole[s[0]][: len(s)] == s for s in found)  # each one a beginning of its sequence
    if not shuffle:  # the first column to run out ends the epoch
        padded = list(pack_sequences(sequences, batch_size, length))
        ends = [] if not padded else [int((y != -100).sum()) for y in torch.cat([y for _, y, _ in padded]).t()]
        assert sum(x.shape[0] for x, _, _ in batches) == (min(ends) if ends else 0)


@settings(max_examples=200, deadline=None)
@given(**packing, align=st.integers(1, 7), drop_last=st.booleans())
def test_aligned_sequences_start_at_multiples_of_align_and_keep_every_token(
    lengths, batch_size, length, shuffle, align, drop_last
):
    sequences = corpus(lengths)
    packed = pack_sequences(sequences, batch_size, length, shuffle=shuffle, seed=3, align=align, drop_last=drop_last)
    batches = list(packed)
    assert len(batches) == len(packed)
    assert sum(x.shape[0] for x, _, _ in batches) == packed.steps
    if not batches:
        return
    x, y, starts = (torch.cat(parts) for parts in zip(*batches))
    steps, _ = torch.nonzero(starts, as_tuple=True)
    assert (steps % align == 0).all()  # every start on the grid, so none splits a window of k1 = align
    found = sorted(tuple(s) for column in unpack(batches) for s in column)
    whole = sorted(tuple(s.tolist()) for s in sequences if len(s) >= 2)
    if drop_last:  # each one a beginning of its sequence
        complete = {s[0]: s for s in whole}
        assert all(complete[s[0]][: len(s)] == s for s in found)
    else:
        assert found == whole
        assert (x[y == -100] == 0).all()  # padding steps hold pad_value


def test_aligned_packing_pads_after_each_sequence_to_the_next_multiple():
    sequences = corpus([6, 3, 9])  # 5, 2 and 8 steps
    x, y, starts = next(iter(pack_sequences(sequences, 1, length=24, align=4)))
    assert torch.nonzero(starts[:, 0]).flatten().tolist() == [0, 8, 12]
    assert (y[5:8, 0] == -100).all() and (y[10:12, 0] == -100).all()
    assert x.shape[0] == 20  # 8 + 4 + 8


def test_align_must_be_a_positive_int():
    with pytest.raises(ValueError, match="align"):
        pack_sequences(corpus([5]), 1, 4, align=0)


def test_the_next_sequence_goes_to_the_column_that_frees_first():
    # Steps 6, 2, 3, 1, 4: column 1 frees at 2 and takes the third, at 5 the fourth; at 6 both free, column 0
    # (the lower) takes the fifth.
    sequences = corpus([7, 3, 4, 2, 5])
    columns = unpack(list(pack_sequences(sequences, 2, length=4)))
    firsts = [[s[0] for s in column] for column in columns]
    assert firsts == [[0, 16], [7, 10, 14]]


def test_padding_is_ignored_and_only_at_the_tail():
    x, y, starts = (torch.cat(p) for p in zip(*pack_sequences(corpus([9, 3]), 2, length=3)))
    assert y[:, 0].tolist() == list(range(1, 9))
    assert y[:, 1].tolist() == [10, 11, *[-100] * 6] and x[2:, 1].eq(0).all()
    assert starts.nonzero().tolist() == [[0, 0], [0, 1]]


def test_sequences_are_read_lazily():
    read = []

    def sequences():
        for i in range(100):
            read.append(i)
            yield torch.arange(10)  # 9 steps each

    batches = iter(pack_sequences(sequences(), 2, length=5))
    next(batches)
    assert len(read) == 2  # one per column
    next(batches)
    assert len(read) == 4
    with pytest.raises(TypeError, match="no length"):
        len(pack_sequences(sequences(), 2, 5))


def test_shuffle_is_seeded_per_epoch_and_keeps_the_epoch_length():
    sequences = corpus([5, 17, 3, 9, 12, 4, 8, 2])
    packed = pack_sequences(sequences, 3, length=4, shuffle=True, seed=7)
    orders = []
    for epoch in (0, 1, 0):
        packed.set_epoch(epoch)
        batches = list(packed)
        assert len(batches) == len(packed)
        orders.append(unpack(batches))
    assert orders[0] == orders[2] and orders[0] != orders[1]
    assert orders[0] != unpack(list(pack_sequences(sequences, 3, length=4)))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(sequences=[torch.zeros(2, 2)]), ValueError, "sequence 0 has shape"),
        (dict(sequences=[[1, 2, 3]]), TypeError, "sequence 0 is a list"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(length=1.5), TypeError, "length"),
        (dict(sequences=iter([torch.arange(3)]), shuffle=True), TypeError, "shuffle=True"),
    ],
)
def test_bad_input(kwargs, error, match):
    args = dict(sequences=[torch.arange(4)], batch_size=2, length=3) | kwargs
    with pytest.raises(error, match=match):
        list(pack_sequences(**args))


def test_columns_picture_matches_the_packing():
    from ignite_tbptt import plot_columns

    # Steps 6, 2, 3, 1, 4 in two columns: column 0 holds sequences 0 and 4, column 1 sequences 1, 2 and 3.
    fig = plot_columns(pack_sequences(corpus([7, 3, 4, 2, 5]), 2, length=4), k1=3)
    bars = {p.get_gid(): (p.get_x(), p.get_x() + p.get_width()) for p in fig.axes[0].patches if p.get_gid()}
    assert bars == {
        "sequence-0-0": (0, 6),
        "sequence-0-1": (6, 10),
        "sequence-1-0": (0, 2),
        "sequence-1-1": (2, 5),
        "sequence-1-2": (5, 6),
        "padding-1": (6, 10),
    }


def test_drop_last_with_fewer_sequences_than_columns_gives_no_batch():
    packed = pack_sequences(corpus([5, 9]), 3, length=4, drop_last=True)
    assert len(packed) == 0 and list(packed) == []


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool, torch.int16, torch.int64])
def test_padding_targets_never_read_as_a_real_token(dtype):
    sequences = [torch.tensor([1, 0, 1, 1], dtype=dtype), torch.tensor([0, 1], dtype=dtype)]
    x, y, starts = next(iter(pack_sequences(sequences, 2, length=4)))
    assert x.dtype == dtype
    assert y.dtype == (dtype if dtype in (torch.int16, torch.int64) else torch.int64)  # -100 fits, or promoted
    assert y[1:, 1].tolist() == [-100, -100]  # the second column's padding
    assert y[:, 0].tolist() == [0, 1, 1] and y[0, 1].item() == 1  # real targets keep their values


def test_terminate_on_nan_runs_shuffled_packed_epochs_to_the_end():
    # Shuffled packing pads every epoch to the longest packing any order can give, so an epoch may end in
    # batches of padding only; they train nothing and output 0.0, not a NaN that TerminateOnNan would stop on.
    from ignite.engine import Events
    from ignite.handlers import TerminateOnNan

    from ignite_tbptt import create_tbptt_trainer

    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 80, (30,), generator=g, device="cpu")
    sequences = [
        torch.randint(0, 16, (int(n),), generator=g, device="cpu").to(torch.get_default_device()) for n in lengths
    ]
    batches = pack_sequences(sequences, 4, 10, shuffle=True, seed=0)
    model = TokenGRU()
    trainer = create_tbptt_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        lambda y_pred, y: torch.nn.functional.cross_entropy(y_pred.flatten(0, 1), y.flatten()),
        5,
        carry_hidden=True,
        target_count_fn=lambda y_pred, y: int((y != -100).sum()),
    )
    trainer.add_event_handler(Events.EPOCH_STARTED, lambda e: batches.set_epoch(e.state.epoch - 1))
    trainer.add_event_handler(Events.ITERATION_COMPLETED, TerminateOnNan())
    padding_only = []

    @trainer.on(Events.ITERATION_COMPLETED)
    def record(engine):
        if (engine.state.batch[1] == -100).all():
            padding_only.append((engine.state.epoch, engine.state.output))

    state = trainer.run(batches, max_epochs=3)
    assert (state.epoch, state.iteration) == (3, 3 * len(batches))
    assert len(padding_only) >= 3 and all(output == 0.0 for _, output in padding_only)
    assert all(torch.isfinite(p).all() for p in model.parameters())


class TokenGRU(torch.nn.Module):
    def __init__(self, vocab=16, hidden=8):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, hidden)
        self.rnn = torch.nn.GRU(hidden, hidden)
        self.readout = torch.nn.Linear(hidden, vocab)

    def forward(self, x, hidden=None):
        out, hidden = self.rnn(self.embedding(x), hidden)
        return self.readout(out), hidden


@pytest.mark.parametrize("sequences", [[], [torch.tensor([7])], iter([])], ids=["empty list", "one token", "iterator"])
def test_nothing_to_pack_is_an_error_not_an_epoch_without_batches(sequences):
    packed = pack_sequences(sequences, batch_size=2, length=4)
    with pytest.raises(ValueError, match="pack_sequences got no sequence of at least two tokens"):
        list(packed)
    if isinstance(sequences, list):  # len() reads the lengths first, as ignite does when a run starts
        with pytest.raises(ValueError, match="an epoch would have no batch"):
            len(packed)
