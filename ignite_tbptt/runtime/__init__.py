"""Runtime: the torch side of the trainer, which carries out the plans and knows nothing of ignite.

The executor (:class:`SegmentExecutor`) runs one segment as its :class:`~ignite_tbptt.planning.SegmentPlan` says:
the model call (:class:`ModelCall`), the segment's loss paid at once or owed to its window (:class:`LossRule`), and
what the stream's :class:`RetainedHistory` keeps for the window's backward sweep. The second executor
(:class:`ProgramExecutor`, ``cuda_graphs``, the subpackage :mod:`ignite_tbptt.runtime.programs`) runs the windows
planning gives it whole as programs, captured in CUDA graphs on a GPU, and the other segments as the first;
:func:`build_executor` makes the one an :class:`Execution` names. With it, optimizer steps run as step programs
(:class:`StepPrograms`) where they can. Around
them: the stream's state with its ``state_dict`` (:class:`StreamState`), the weights retained graphs need across
optimizer steps (:class:`ParameterVersions`), hidden states as trees of tensors and their per-column reset, the
random state restored for a segment's recomputation, the optimizer step's body (the gradients' division and
inf/NaN check, the step, the scale's update; eager and in programs alike), what ``torch.compile`` and FSDP2 need,
state kept in module attributes, and the refusal of a model that writes into the state it was given. Modules here
import torch, :mod:`ignite_tbptt.planning` and each other, never ignite. A new kind of hidden state (how it is
flattened, detached, reset) goes here.
"""

from typing import Any

from ..checks import renamed
from .backward_sweep import Recomputation, RetainedHistory, Segment, reach_profile
from .compiled import retainable
from .executor import SegmentExecutor, SegmentResult
from .gradients import divide_and_check, skips_on_device
from .hidden import cat as join_along
from .in_place import StateWrittenInPlace, tensors_with_paths
from .loss_rule import LossRule
from .loss_sum import LossSum
from .model_call import ModelCall, autocast_for, build_model_call, default_model_fn, device_type_of
from .module_state import ModuleState, attributes_with_graph, check_attributes
from .profiling import profiled, profiling
from .programs import (
    Execution,
    GraphCapture,
    GraphCaptureError,
    Program,
    ProgramCache,
    ProgramCounts,
    ProgramExecutor,
    StaticGradients,
    StepHandler,
    StepHandlers,
    StepProgram,
    StepPrograms,
    WindowProgram,
    build_executor,
)
from .reset import Resets, check_resettable, default_reset_hidden, reset_to, stop_gradient
from .rng import refuse_own_dropout_state
from .sharded import is_sharded, reduce_gradients_by_sum
from .step_body import divide_gradients, gradients_of, parameters_of, step_optimizer, unscale_and_divide
from .stream import StreamState
from .weight_versions import ParameterVersions, WeightVersion

__all__ = [
    "SegmentExecutor",
    "SegmentResult",
    "join_along",
    "StreamState",
    "RetainedHistory",
    "Segment",
    "Recomputation",
    "reach_profile",
    "ParameterVersions",
    "WeightVersion",
    "ModelCall",
    "build_model_call",
    "default_model_fn",
    "autocast_for",
    "device_type_of",
    "Resets",
    "default_reset_hidden",
    "check_resettable",
    "reset_to",
    "stop_gradient",
    "refuse_own_dropout_state",
    "ModuleState",
    "attributes_with_graph",
    "check_attributes",
    "StateWrittenInPlace",
    "tensors_with_paths",
    "LossSum",
    "divide_and_check",
    "skips_on_device",
    "parameters_of",
    "gradients_of",
    "unscale_and_divide",
    "divide_gradients",
    "step_optimizer",
    "Execution",
    "build_executor",
    "ProgramExecutor",
    "WindowProgram",
    "GraphCaptureError",
    "GraphCapture",
    "Program",
    "ProgramCache",
    "ProgramCounts",
    "StaticGradients",
    "StepHandler",
    "StepHandlers",
    "StepProgram",
    "StepPrograms",
    "LossRule",
    "profiled",
    "profiling",
    "retainable",
    "is_sharded",
    "reduce_gradients_by_sum",
]


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, {"SweepProgram": ("WindowProgram", WindowProgram)})
