"""Data: batches for the trainer, from one long token sequence or from many sequences and recordings.

:func:`stream_batches` cuts one token sequence into the pieces of a ``carry_hidden=True`` stream;
:func:`pack_sequences` and :func:`pack_recordings` pack many sequences into the columns of such a stream, marking
where each starts (batches ``(x, y, starts)``) and padding what is left; :func:`masked_loss` and
:func:`count_targets` leave that padding out. :class:`RecordingWindows` cuts windows from recordings for a
``DataLoader`` to shuffle, each a stream of its own (with a burn-in), and :func:`recording_columns` lays a recording
out as the columns of one stream; :func:`multisine`, :func:`duffing` and :func:`wiener_hammerstein` simulate
recordings of nonlinear systems to identify. :mod:`ignite_tbptt.data.batch` holds the checks every batch passes
and ``prepare_batch``; in a distributed run each process keeps its share of the columns
(:mod:`ignite_tbptt.data.shards`). Modules here import torch, ignite and :mod:`ignite_tbptt.checks`.
"""

from .batch import prepare_batch
from .masks import count_targets, masked_loss
from .recording_windows import RecordingWindows, recording_columns
from .recordings import PackedRecordings, pack_recordings
from .sequences import PackedSequences, pack_sequences
from .shards import Shard, shard_of
from .streams import stream_batches
from .systems import duffing, multisine, wiener_hammerstein

__all__ = [
    "stream_batches",
    "pack_sequences",
    "PackedSequences",
    "pack_recordings",
    "PackedRecordings",
    "RecordingWindows",
    "recording_columns",
    "multisine",
    "duffing",
    "wiener_hammerstein",
    "masked_loss",
    "count_targets",
    "prepare_batch",
    "Shard",
    "shard_of",
]
