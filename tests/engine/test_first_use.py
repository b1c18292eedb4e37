"""What a new user tries in a first hour: the documented forms work, and the usual mistakes are named.

Each planted mistake (a count of the predictions, padding without a count, batch-first data read time-first, a model
returning its state first, a forward that needs a state at a stream's start) gets an error or a warning that names
the argument and the fix; the documented forms train with the numbers they promise.
"""

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ignite_tbptt import GradientClipping, TBPTTEvents, count_targets, create_tbptt_trainer


class TinyLM(nn.Module):
    """A GRU language model; ``swapped`` returns ``(hidden, logits)``, ``batch_first`` reads ``(B, T)`` tokens."""

    def __init__(self, vocab=10, hidden=6, swapped=False, batch_first=False):
        super().__init__()
        self.emb, self.out = nn.Embedding(vocab, 5), nn.Linear(hidden, vocab)
        self.rnn = nn.GRU(5, hidden, batch_first=batch_first)
        self.swapped = swapped

    def forward(self, x, hidden=None):
        h, hidden = self.rnn(self.emb(x), hidden)
        return (hidden, self.out(h)) if self.swapped else (self.out(h), hidden)


def cross_entropy(y_pred, y):
    return F.cross_entropy(y_pred.flatten(0, -2), y.flatten())


def window_records(trainer):
    records = []
    trainer.add_event_handler(
        TBPTTEvents.WINDOW_COMPLETED, lambda e: records.append((e.state.window_targets, float(e.state.window_loss)))
    )
    return records


def padded_batch():
    """(T=12, B=8) tokens: steps 0-3 are padding in every column, steps 4-7 in columns 4-7."""
    x = torch.randint(0, 10, (12, 8), generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[:4] = -100
    y[4:8, 4:] = -100
    return x, y


def trained(target_count_fn, batch):
    torch.manual_seed(0)
    model = TinyLM().double()
    trainer = create_tbptt_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, k1=4, target_count_fn=target_count_fn
    )
    records = window_records(trainer)
    trainer.run([batch])
    return model, records


def test_count_targets_passed_as_documented_counts_the_targets_not_the_predictions():
    model, records = trained(count_targets, padded_batch())
    # 0, 16 and 32 real targets in the three windows; the predictions have 4 * 8 * 10 = 320 elements each.
    assert [n for n, _ in records] == [0, 16, 32]
    # A window without targets contributes nothing, and reports 0 for 0 targets.
    assert records[0] == (0, 0.0)
    reference, reference_records = trained(lambda y_pred, y: count_targets(y), padded_batch())
    assert records == reference_records
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)


def test_a_count_of_more_targets_than_y_has_is_refused_naming_target_count_fn():
    with pytest.raises(ValueError, match=r"target_count_fn counted 320 targets in a segment whose y has 32"):
        trained(lambda y_pred, y: y_pred.numel(), padded_batch())


def test_a_count_function_of_y_alone_is_refused_at_construction_with_the_form_the_trainer_calls():
    model = TinyLM()
    with pytest.raises(TypeError, match=r"target_count_fn is called as target_count_fn\(y_pred, y\).*count_targets"):
        create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, 4,
                             target_count_fn=lambda y: (y != -100).sum())  # fmt: skip


def test_count_targets_takes_ignore_index_by_keyword_and_by_position_with_a_deprecation():
    y = torch.tensor([[0, 1], [0, 2]])
    assert count_targets(y, ignore_index=0).item() == 2
    assert count_targets(torch.zeros(2, 2, 3), y, ignore_index=0).item() == 2
    with pytest.warns(DeprecationWarning, match=r"count_targets\(y, ignore_index=0\)"):
        assert count_targets(y, 0).item() == 2  # by position, as before 0.5
    with pytest.raises(TypeError, match="ignore_index by keyword"):
        count_targets(y, "-100")


def test_padding_without_a_count_is_named_where_the_run_starts():
    with pytest.warns(UserWarning, match=r"padding \(48 of 96 elements.*target_count_fn=count_targets"):
        _, records = trained(None, padded_batch())
    # As SPEC.md defines the default (y.numel() targets), the window of padding only reports loss_fn's NaN.
    assert records[0][0] == 32 and records[0][1] != records[0][1]


def test_padding_that_first_appears_later_is_named_where_the_batch_loss_is_nan():
    x, y = padded_batch()
    clean = (x, x.clone())
    with pytest.warns(UserWarning, match="target_count_fn is None"):
        torch.manual_seed(0)
        model = TinyLM()
        trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, k1=4)
        trainer.run([clean, (x, y)])


def test_batch_first_data_read_with_the_default_time_dim_is_named():
    tokens = torch.randint(0, 10, (8, 12))  # (B, T): batch first
    model = TinyLM(batch_first=True)
    with pytest.warns(UserWarning, match=r"model.rnn is a GRU with batch_first=True, but time_dim=0"):
        trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, k1=4)
    with pytest.warns(UserWarning, match=r"has 12 columns and 4 steps, but no leaf of the state.*time_dim=1"):
        trainer.run([(tokens, tokens)])


def test_a_model_of_batch_first_layers_without_the_declaration_is_named_by_its_state():
    class BatchFirst(TinyLM):  # batch-first data, the layer given time first inside the model
        def forward(self, x, hidden=None):
            h, hidden = self.rnn(self.emb(x).transpose(0, 1), hidden)
            return self.out(h).transpose(0, 1), hidden

    tokens = torch.randint(0, 10, (8, 12))  # (B, T)
    model = BatchFirst()
    trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, k1=4)
    with pytest.warns(UserWarning, match="time_dim=1"):
        trainer.run([(tokens, tokens)])
    # With time_dim=1 the same data trains three windows of 4 steps, without a word.
    trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, 4, time_dim=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trainer.run([(tokens, tokens)]).window == 3


@pytest.mark.parametrize("rnn", [nn.GRU, nn.LSTM])
def test_a_model_returning_its_state_first_is_told_so(rnn):
    model = TinyLM(swapped=True)
    model.rnn = rnn(5, 6)
    tokens = torch.randint(0, 10, (12, 8))
    trainer = create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), cross_entropy, k1=4)
    with pytest.raises(TypeError, match=r"the model may return \(hidden, y_pred\).*model_fn=") as error:
        trainer.run([(tokens, tokens)])
    assert error.value.__cause__ is not None  # loss_fn's own error, kept as the cause


def test_a_loss_error_with_predictions_in_order_is_left_as_it_is():
    model = TinyLM()
    tokens = torch.randint(0, 10, (12, 8))
    trainer = create_tbptt_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), lambda y_pred, y: F.cross_entropy(y_pred, y), k1=4
    )
    with pytest.raises((RuntimeError, ValueError)) as error:
        trainer.run([(tokens, tokens)])
    assert "(hidden, y_pred)" not in str(error.value)


class WordLM(nn.Module):
    """A model in the shape of PyTorch's word-language-model example: ``forward(input, hidden)`` needs the state,
    ``init_hidden(bsz)`` makes it, and the output is flattened to ``(T * B, ntoken)`` log-probabilities."""

    def __init__(self, ntoken=20, ninp=8, nhid=12, nlayers=2, dropout=0.2):
        super().__init__()
        self.ntoken, self.nlayers, self.nhid = ntoken, nlayers, nhid
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def test_a_forward_that_needs_the_state_is_refused_at_construction_naming_initial_state():
    model = WordLM()
    with pytest.raises(
        TypeError, match=r"forward\(input, hidden\).*initial_state=lambda batch_size: model.init_hidden"
    ):
        create_tbptt_trainer(model, torch.optim.SGD(model.parameters(), lr=1.0), F.nll_loss, k1=5)


def test_the_word_language_model_example_trains_as_its_own_loop_with_initial_state():
    """Its loop: the state from init_hidden at each epoch's start, detached every bptt steps, clipping, plain SGD."""
    bptt, lr, clip, epochs = 7, 2.0, 0.25, 2
    corpus = torch.randint(0, 20, (4 * 30 + 3,), generator=torch.Generator().manual_seed(1))
    data = corpus[: corpus.numel() // 4 * 4].view(4, -1).t().contiguous()  # batchify: (T, B=4)
    torch.manual_seed(0)
    theirs = WordLM().double()
    ours = copy.deepcopy(theirs)

    torch.manual_seed(1)
    for _ in range(epochs):
        theirs.train()
        hidden = theirs.init_hidden(4)
        for i in range(0, data.size(0) - 1, bptt):
            seq_len = min(bptt, data.size(0) - 1 - i)
            x, targets = data[i : i + seq_len], data[i + 1 : i + 1 + seq_len].reshape(-1)
            hidden = tuple(h.detach() for h in hidden)
            theirs.zero_grad()
            output, hidden = theirs(x, hidden)
            F.nll_loss(output, targets).backward()
            nn.utils.clip_grad_norm_(theirs.parameters(), clip)
            for p in theirs.parameters():
                p.data.add_(p.grad, alpha=-lr)

    trainer = create_tbptt_trainer(
        ours,
        torch.optim.SGD(ours.parameters(), lr=lr),
        lambda output, y: F.nll_loss(output, y.reshape(-1)),
        k1=bptt,
        carry_hidden=True,
        initial_state=ours.init_hidden,
    )
    GradientClipping(ours, max_norm=clip).attach(trainer)
    lengths = [(i, min(bptt, data.size(0) - 1 - i)) for i in range(0, data.size(0) - 1, bptt)]  # get_batch's
    batches = [(data[i : i + n], data[i + 1 : i + 1 + n]) for i, n in lengths]
    torch.manual_seed(1)
    trainer.run(batches, max_epochs=epochs)
    assert trainer.state.window == epochs * len(batches)
    for p, q in zip(theirs.parameters(), ours.parameters()):
        assert torch.equal(p, q)
