"""The models page's checked table: ``python -m benchmarks.models`` runs ``check_model`` on each model and rewrites it.

Each row is a model as a user builds it (small, on the CPU, float64 where the model allows), passed to the trainer
as the row says, with :func:`ignite_tbptt.check_model`'s verdicts and what it says where a property fails; the
packages' installed versions and the date head the table. The section of ``docs/models.md`` between the two markers
is replaced; the rest of the page is written by hand. A model whose package is not installed is listed as such.
flash-linear-attention's models run on the CPU with their Triton kernels replaced by the PyTorch references the tests
use (``tests/models/fla_reference.py``).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.report import markdown_table

__all__ = ["MODELS", "main", "rows", "section"]

PAGE = Path(__file__).parent.parent / "docs" / "models.md"
BEGIN = "<!-- begin: python -m benchmarks.models -->"
END = "<!-- end: python -m benchmarks.models -->"
PROPERTIES = ("carried", "used", "gradient", "reset", "clean", "trains")


def _features(steps: int = 12, columns: int = 3, width: int = 3, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(steps, columns, width, dtype=dtype, generator=torch.Generator().manual_seed(0))


def _tokens(vocab: int, steps: int = 12, columns: int = 3) -> torch.Tensor:
    return torch.randint(0, vocab, (columns, steps), generator=torch.Generator().manual_seed(0))  # (B, T)


def _torch(make: Callable[[], nn.Module]) -> Callable[[], tuple]:
    return lambda: (make().double(), _features(), {})


@dataclasses.dataclass
class _LSTMState:
    h: torch.Tensor
    c: torch.Tensor


class _DataclassState(nn.Module):
    # A dataclass state around nn.LSTM, as the page's row has it.
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4)

    def forward(self, x: torch.Tensor, state: _LSTMState | None = None) -> tuple[torch.Tensor, _LSTMState]:
        y, (h, c) = self.lstm(x, None if state is None else (state.h, state.c))
        return y, _LSTMState(h, c)


class _LeakyLoop(nn.Module):
    # snnTorch neurons with init_hidden=False: the membrane passed in and returned, as the models page's row has it.
    def __init__(self) -> None:
        import snntorch as snn

        super().__init__()
        self.fc, self.lif = nn.Linear(3, 8), snn.Leaky(beta=0.9, init_hidden=False, reset_mechanism="none")

    def forward(self, x: torch.Tensor, mem: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        mem = self.lif.init_leaky() if mem is None else mem
        out = []
        for x_t in x:
            _, mem = self.lif(self.fc(x_t), mem)
            out.append(mem)
        return torch.stack(out), mem


def _spiking(module_state: bool) -> tuple:
    from ignite_tbptt.examples._spiking_vowels import STATE, SpikingSpeakerNet

    torch.manual_seed(0)
    options = {"module_state": STATE} if module_state else {}
    return SpikingSpeakerNet(hidden=16), 3 * _features(width=12, dtype=torch.float32), options


def _xlstm(adapted: bool) -> tuple:
    from ignite_tbptt.examples._xlstm_lm import build_model, xlstm_model_fn

    torch.manual_seed(0)
    own = lambda m, x, state: m(x) if state is None else m(x, state)  # noqa: E731 - the model's own forward
    return (
        build_model(11, embedding=32, chunk=4),
        _tokens(11, steps=16),
        {
            "model_fn": xlstm_model_fn if adapted else own,
            "time_dim": 1,
        },
    )


def _memory_transformer() -> tuple:
    from ignite_tbptt.examples._memory_transformer import MemoryTransformer

    torch.manual_seed(0)
    model = MemoryTransformer(11, width=16, heads=2, memory=4, segment=16).double()
    return model, _tokens(11), {"initial_state": model.start, "time_dim": 1}


def _mamba2(adapted: bool, variant: str = "cache returned") -> tuple:
    import transformers

    from ignite_tbptt.models import mamba2_model_fn, mamba2_reset_hidden

    torch.manual_seed(0)
    config = transformers.Mamba2Config(
        vocab_size=11, hidden_size=16, num_heads=2, head_dim=16, expand=2, state_size=8, n_groups=1,
        num_hidden_layers=2, chunk_size=4, conv_kernel=4,
    )  # fmt: skip
    model = transformers.Mamba2ForCausalLM(config).double()
    if adapted:
        return model, _tokens(11), {"model_fn": mamba2_model_fn, "reset_hidden": mamba2_reset_hidden, "time_dim": 1}

    def cache_returned(m: Any, x: torch.Tensor, state: Any) -> tuple:
        out = m(x, cache=state, use_cache=True)
        return out.logits, out.cache

    kept: dict[str, Any] = {}

    def one_cache(m: Any, x: torch.Tensor, state: Any) -> tuple:
        # One cache kept across calls, its tensors returned as the state.
        if state is None:
            kept["cache"] = transformers.DynamicCache(config=m.config)
        cache = kept["cache"]
        out = m(x, cache=cache, use_cache=True)
        layers = range(m.config.num_hidden_layers)
        return out.logits, tuple((cache.get_conv_state(i), cache.get_recurrent_state(i)) for i in layers)

    model_fn = one_cache if variant == "one cache" else cache_returned
    return model, _tokens(11), {"model_fn": model_fn, "time_dim": 1}


def _mamba_fresh_cache(model: Any, x: torch.Tensor, state: Any) -> tuple:
    # mamba2_model_fn's form for Hugging Face's Mamba v1: a fresh cache per call, seeded with the carried
    # (conv, ssm) of each layer, its tensors returned.
    from transformers import DynamicCache

    config = model.config
    cache = DynamicCache(config=config)
    for i, (conv, ssm) in enumerate(state or ()):
        cache.update_conv_state(conv, i, conv_kernel_size=config.conv_kernel)
        cache.update_recurrent_state(ssm, i)
    out = model(input_ids=x, cache=cache, use_cache=True)
    layers = range(config.num_hidden_layers)
    return out.logits, tuple((cache.get_conv_state(i), cache.get_recurrent_state(i)) for i in layers)


def _mamba_v1() -> tuple:
    import transformers

    torch.manual_seed(0)
    config = transformers.MambaConfig(
        vocab_size=11, hidden_size=16, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4
    )
    model = transformers.MambaForCausalLM(config).double()
    return model, _tokens(11), {"model_fn": _mamba_fresh_cache, "time_dim": 1}


def _rwkv() -> tuple:
    import transformers

    torch.manual_seed(0)
    config = transformers.RwkvConfig(
        vocab_size=11, hidden_size=16, num_hidden_layers=2, attention_hidden_size=16, intermediate_size=32
    )
    model = transformers.RwkvForCausalLM(config).double()

    def state_returned(m: Any, x: torch.Tensor, state: Any) -> tuple:
        out = m(input_ids=x, state=state, use_cache=True)
        return out.logits, out.state

    return model, _tokens(11), {"model_fn": state_returned, "time_dim": 1}


def _fla(name: str, adapted: bool = True) -> tuple:
    from ignite_tbptt.models import fla_model_fn, fla_reset_hidden
    from tests.models.test_fla import build_model

    if adapted:
        return (
            build_model(name),
            _tokens(11),
            {"model_fn": fla_model_fn, "reset_hidden": fla_reset_hidden, "time_dim": 1},
        )

    def cache_returned(m: Any, x: torch.Tensor, state: Any) -> tuple:
        out = m(x, past_key_values=state, use_cache=True)
        return out.logits, out.past_key_values

    return build_model(name), _tokens(11), {"model_fn": cache_returned, "time_dim": 1}


#: Each row: the model as the page names it, the package whose version it gives, what is passed, and its factory.
MODELS: list[tuple[str, str, str, Callable[[], tuple]]] = [
    ("`nn.RNN`", "torch", "nothing", _torch(lambda: nn.RNN(3, 4))),
    ("`nn.GRU`, 2 layers", "torch", "nothing", _torch(lambda: nn.GRU(3, 4, num_layers=2))),
    ("`nn.LSTM`, 2 layers", "torch", "nothing", _torch(lambda: nn.LSTM(3, 4, num_layers=2))),
    ("`nn.GRU`, bidirectional", "torch", "nothing", _torch(lambda: nn.GRU(3, 4, bidirectional=True))),
    ("a dataclass state around `nn.LSTM`", "torch", "nothing", _torch(_DataclassState)),
    (
        "`snn.Leaky(init_hidden=False)`, membrane returned",
        "snntorch",
        "nothing",
        lambda: (_LeakyLoop(), _features(dtype=torch.float32), {}),
    ),
    ("`snn.Leaky(init_hidden=True)` (examples.spiking_vowels)", "snntorch", "nothing", lambda: _spiking(False)),
    ("the same", "snntorch", "`module_state=['lif1.mem', 'lif2.mem']`", lambda: _spiking(True)),
    ("`xLSTMLarge`, its own forward", "xlstm", "`model_fn` calling `model(x, state)`", lambda: _xlstm(False)),
    ("the same", "xlstm", "the example's `xlstm_model_fn`", lambda: _xlstm(True)),
    ("memory transformer (examples)", "torch", "`initial_state=model.start`", _memory_transformer),
    ("`Mamba2ForCausalLM`", "transformers", "`model_fn` returning `out.cache`", lambda: _mamba2(False)),
    (
        "the same",
        "transformers",
        "one cache kept across calls, its tensors returned",
        lambda: _mamba2(False, "one cache"),
    ),
    ("the same", "transformers", "`mamba2_model_fn`, `mamba2_reset_hidden`", lambda: _mamba2(True)),
    ("`MambaForCausalLM` (Mamba v1)", "transformers", "the same fresh-cache `model_fn`", _mamba_v1),
    ("`RwkvForCausalLM`", "transformers", "`model_fn` returning `out.state`", _rwkv),
    (
        "`GatedDeltaNetForCausalLM` (reference kernels)",
        "flash-linear-attention",
        "`model_fn` returning `out.past_key_values`",
        lambda: _fla("gated_deltanet", adapted=False),
    ),
    *(
        (f"`{model}` (reference kernels)", "flash-linear-attention", "`fla_model_fn`, `fla_reset_hidden`", factory)
        for model, factory in (
            ("GatedDeltaNetForCausalLM", lambda: _fla("gated_deltanet")),
            ("GLAForCausalLM", lambda: _fla("gla")),
            ("DeltaNetForCausalLM", lambda: _fla("delta_net")),
            ("fla's Mamba2ForCausalLM", lambda: _fla("mamba2")),
        )
    ),
]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cell(passed: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[passed]


def rows() -> list[list[str]]:
    """Each model's row: name, package and version, what is passed, the verdicts, and the failures' details."""
    from ignite_tbptt import check_model

    out = []
    for name, package, passed, make in MODELS:
        version = _version(package)
        if version == "not installed":
            out.append([name, f"{package} (not installed)", passed, *("-" * len(PROPERTIES)), "not run"])
            continue
        model, x, options = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the trainer's advice on the made-up data, not the check's
            check = check_model(model, x, **options)
        said = "; ".join(f"{v.name}: {v.detail}" for v in check.verdicts if v.passed is False)
        out.append([name, f"{package} {version}", passed, *(_cell(check[p].passed) for p in PROPERTIES), said or "-"])
    return out


def section(table_rows: list[list[str]]) -> str:
    """The page's generated section: the command, the date, the table."""
    header = ["model", "package", "passed to the trainer", *PROPERTIES, "what check_model says where it fails"]
    date = datetime.date.today().isoformat()
    return (
        f"{BEGIN}\nRegenerated by `python -m benchmarks.models` on {date} (CPU, torch {torch.__version__}); "
        "rerun it rather than editing the rows.\n\n" + markdown_table(header, table_rows) + f"\n{END}"
    )


def main() -> None:
    """Run every model's check and rewrite the section of ``docs/models.md`` between the markers."""
    from _pytest.monkeypatch import MonkeyPatch

    from tests.models.fla_reference import use_reference_kernels

    with MonkeyPatch.context() as patch:
        if _version("flash-linear-attention") != "not installed":
            use_reference_kernels(patch)
        table_rows = rows()
    page = PAGE.read_text()
    start, end = page.index(BEGIN), page.index(END) + len(END)
    PAGE.write_text(page[:start] + section(table_rows) + page[end:])
    print(section(table_rows))


if __name__ == "__main__":
    main()
