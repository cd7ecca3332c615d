"""The A/B modes of a verification and how they map onto schedules (torch-free).

  baseline       schedule none, no delayed wgrad: the reference every other mode is compared against
  overlap        the overlap schedule (1f1b when the package has it, else chunked):
                 overlap_moe_expert_parallel_comm = True
  overlap+wgrad  1f1b with delayed expert wgrad: delay_wgrad_compute = True (1f1b only)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moe_overlap.verify.plan.config import VerifyConfig
from moe_overlap.verify.plan.options import MODES


class ModeError(ValueError):
    def __init__(self, message: str, field: str = "modes", fix: str | None = None):
        super().__init__(message)
        self.message, self.field, self.fix = message, field, fix


@dataclass(frozen=True)
class ModeSpec:
    name: str
    schedule: str  # none | chunked | 1f1b
    delay_wgrad: bool

    @property
    def overlap(self) -> bool:
        return self.schedule != "none"

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_modes(cfg: VerifyConfig, modes: list[str] | None, schedule: str | None) -> tuple[list[ModeSpec], list[str]]:
    """The modes to run, in order, plus notes on what was left out and why."""
    notes: list[str] = []
    if schedule is None:
        schedule = cfg.schedule if cfg.schedule != "none" else "1f1b"
    explicit = modes is not None
    wanted = list(modes) if explicit else [m for m in MODES if m != "overlap+wgrad" or cfg.delay_wgrad_compute]
    if "overlap+wgrad" in wanted and schedule != "1f1b":
        if explicit:
            raise ModeError("mode overlap+wgrad needs the 1f1b schedule (delayed wgrad runs inside it)",
                            fix="add --schedule 1f1b or drop overlap+wgrad from --modes")
        wanted.remove("overlap+wgrad")
        notes.append("overlap+wgrad skipped: delayed wgrad needs the 1f1b schedule")
    if schedule == "1f1b" and cfg.micro_batches < 2:
        notes.append("1f1b with one micro-batch has nothing to overlap (it runs sequentially)")
    specs = []
    for name in wanted:
        if name == "baseline":
            specs.append(ModeSpec("baseline", "none", False))
        elif name == "overlap":
            specs.append(ModeSpec("overlap", schedule, False))
        else:
            specs.append(ModeSpec("overlap+wgrad", "1f1b", True))
    return specs, notes
