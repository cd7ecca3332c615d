"""The verification report: pydantic models (torch-free).

``schemas/verification-report.schema.json`` is generated from :class:`VerificationReport`
(``python tools/gen_schemas.py``); every report the tests produce is validated against it.

Verdicts:
  passed     every criterion was judged and passed (throughput included: only on --device cuda)
  throughput-not-judged  config validation, completion and loss passed; throughput was measured but is not
             binding on this device (--device cpu), so the run says nothing about speed. Never "passed"
  failed     a run completed but a criterion failed (invalid config, loss mismatch, throughput regression)
  inconclusive  a run completed, nothing failed, but a binding criterion could not be assessed or settled
                (no baseline mode to compare with, no validator installed, a throughput band wider than
                the tolerance: its evidence says how many steps would settle it)
  crashed    a rank raised or exited non-zero (its traceback is in ``failure``)
  hang       a rank sent no heartbeat for ``hang_timeout_s`` (stacks of all ranks in ``failure``)
  timeout    the whole run exceeded ``timeout_s``
  cancelled  cancelled by the caller (threading.Event) or Ctrl-C
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from moe_overlap.verify.judge.analysis_model import Analysis

Verdict = Literal["passed", "throughput-not-judged", "failed", "inconclusive", "crashed", "hang", "timeout",
                  "cancelled"]
CriterionStatus = Literal["pass", "fail", "inconclusive", "skipped"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StepRecord(_Model):
    """One optimizer step of one mode, as rank 0 recorded it (times are the max over ranks)."""

    step: int = Field(ge=0)
    loss: float = Field(description="mean loss over micro-batches and ranks")
    loss_hex: str = Field(description="float.hex() of the loss, for the bitwise comparison")
    step_time_s: float = Field(ge=0)
    tokens_per_s: float = Field(ge=0)
    peak_memory_bytes: int = Field(ge=0, description="CUDA: max allocated during the step; CPU: peak RSS of the rank-0 process (all modes)")
    optimizer_s: float | None = Field(None, ge=0, description="the optimizer update alone, within step_time_s")
    host_issue_s: float | None = Field(None, ge=0, description="host issue time of the forward + backward, within "
                                       "step_time_s: until the host had queued its last work (verify/run/train.py, "
                                       "ep.step.StepResult.issued_at); None: not recorded (older runs)")


class ModeRun(_Model):
    """What one mode (baseline, overlap, overlap+wgrad) did."""

    mode: str
    schedule: Literal["none", "chunked", "1f1b"]
    overlap_moe_expert_parallel_comm: bool
    delay_wgrad_compute: bool
    status: Literal["completed", "incomplete", "not-run"]
    steps: list[StepRecord] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="notes the schedule or worker reported")
    log_files: list[str] = Field(default_factory=list, description="per-rank training logs of this mode")


class Criterion(_Model):
    """One of the seed's four success criteria, with its evidence."""

    id: Literal["config-validation", "completes-cleanly", "throughput", "loss-trajectory"]
    title: str
    status: CriterionStatus = Field(description="pass / fail / inconclusive (measured, not settled: see the "
                                    "evidence), or skipped (could not be measured)")
    binding: bool = Field(description="whether the verdict rests on this criterion (false: throughput on "
                                      "--device cpu, measured and reported only)")
    judged: bool = Field(False, description="binding and assessed (status is not 'skipped'); set from those two")
    summary: str
    evidence: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _judged(self) -> Criterion:
        self.judged = self.binding and self.status != "skipped"
        return self


class RankFailure(_Model):
    rank: int | None = None
    kind: Literal["crashed", "hang", "timeout", "cancelled"]
    message: str
    traceback: str | None = None
    stacks: dict[str, str] = Field(default_factory=dict, description="rank -> faulthandler dump of all threads")


class RunEnvironment(_Model):
    device: Literal["cpu", "cuda"]
    backend: Literal["gloo", "nccl"]
    nproc: int = Field(ge=1)
    python: str
    torch: str | None = None
    platform: str
    hostname: str
    fabric: str = Field("native", description="NCCL fabric of the ranks (ep/fabric.py): native or emulated-net")
    a2a_transport: str | None = Field(None, description="the all-to-all transport the overlap modes used, and why "
                                                        "(ep/transport.py)")
    baseline_transport: str | None = Field(None, description="the baseline's all-to-all transport and why: with "
                                           "--a2a auto the faster alone of NCCL and copy engines "
                                           "(verify/run/baseline_transport.py)")
    a2a_alone_ms: dict[str, float] | None = Field(None, description="the baseline's candidates, one all-to-all "
                                                  "of the run's dispatch each, median ms (slowest rank)")
    sm_margin: str | None = Field(None, description="SMs the 1f1b expert GEMMs left to the all-to-all kernels, "
                                                    "and why (ep/sm_margin.py)")
    graphs: str | None = Field(None, description="whether the experts nodes were replayed from CUDA graphs, and "
                                                 "where (ep/node_graphs.py)")


# The run folder's own record of its batch job (verify/run/slurm_run.py writes it at submission and when the job
# ends; judge/offline.py reads it back, so `verify --judge` of the folder names the job as the launcher did).
CLUSTER_JOB_FILE = "cluster_job.json"
MAX_CLUSTER_JOB_BYTES = 64 << 10  # a few hundred bytes; node lists of thousands of nodes still fit


class ClusterJob(_Model):
    """The batch job a cluster launcher submitted (``verify --launcher slurm``; verify/run/slurm_run.py)."""

    scheduler: Literal["slurm"] = "slurm"
    job_id: str = Field(pattern=r"^\d{1,20}(_\d{1,20})?$", description="as sbatch --parsable printed it")
    state: str = Field(max_length=64, description="the job's last state as Slurm reported it (COMPLETED, "
                                                  "CANCELLED, FAILED, ...; SUBMITTED: recorded at submission)")
    nodes: list[str] | None = Field(None, description="the nodes the job ran on")
    exit_code: str | None = Field(None, description="the batch job's exit code as Slurm writes it, code:signal")
    script: str = Field(description="the sbatch script that was submitted (in the run folder)")
    output: str | None = Field(None, description="the job's stdout/stderr file (slurm-<id>.out)")


class VerificationReport(_Model):
    """report.json of ``moe-overlap verify``."""

    format: Literal["moe-overlap-verification-report"] = "moe-overlap-verification-report"
    version: Literal[1] = 1
    verdict: Verdict
    summary: str
    started_at: str
    elapsed_s: float = Field(ge=0)
    command: str | None = Field(default=None, description="the command line that reproduces this run")
    config_source: str = Field(description="'embedded default', a file path, or 'dict'")
    config: dict[str, Any] = Field(description="the effective VerifyConfig (moe-overlap format)")
    mapping_notes: list[str] = Field(default_factory=list, description="what of the input config was not mapped")
    modes: list[str]
    criteria: list[Criterion]
    runs: list[ModeRun]
    failure: RankFailure | None = None
    analysis: Analysis | None = Field(None, description="where each mode's step time goes, the estimator's "
                                                        "prediction, and why overlap paid or did not")
    environment: RunEnvironment
    out_dir: str
    files: dict[str, str] = Field(default_factory=dict, description="name -> path of report.md, loss.png, logs")
    cluster_job: ClusterJob | None = Field(None, description="the Slurm job that ran the ranks (--launcher slurm)")
    notes: list[str] = Field(default_factory=list)
