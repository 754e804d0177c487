"""Pure formulas (no torch import): the single home of every number ringzero predicts.

Model shapes and parameter counts, FLOPs, memory per GPU (ZeRO, offload, TP/PP, activations),
bytes on the wire per algorithm and per strategy, α-β time, the whole-plan estimate, the strategy
recommendation and the configuration search. Everything else in ringzero (the collectives' cost
model, the engine's predicted-vs-measured report, the tests) calls these functions instead of
re-deriving them.

    from ringzero.plan import Training, Parallel, estimate, model, hardware
    e = estimate(model("llama-2-7b"), Training(), Parallel(dp=8, zero=3), hardware("a100-80gb"))

The names below are functions; the submodules of the same name stay importable
(`from ringzero.plan.strategies.memory import state_bytes`).
"""

from ringzero.plan.config import Parallel, Training
from ringzero.plan.estimate import Estimate, estimate, to_dict
from ringzero.plan.hardware import HARDWARE, Hardware, hardware
from ringzero.plan.strategies.memory import Memory, memory
from ringzero.plan.model.presets import MODELS, model
from ringzero.plan.search.recommend import Recommendation, recommend
from ringzero.plan.search.space import SearchResult, Space, search
from ringzero.plan.model.shapes import ModelShape, ParamCount, approx_params, param_count
from ringzero.plan.step_time import StepTime, step_time

__all__ = ["Parallel", "Training", "Estimate", "estimate", "to_dict", "HARDWARE", "Hardware", "hardware",
           "Memory", "memory", "MODELS", "model", "Recommendation", "recommend", "SearchResult", "Space",
           "search", "ModelShape", "ParamCount", "approx_params", "param_count", "StepTime", "step_time"]
