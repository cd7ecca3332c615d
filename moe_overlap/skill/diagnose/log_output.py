"""A log check as the CLI's `check-logs --format json` prints it and `check_training_log` returns it.

The check itself (logs.py) reads text; where the text came from, and what of a large file was left
unread, belong to the answer too: a check that passed on the head and tail of a 20 GB log says so.
Torch-free.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from moe_overlap.skill.diagnose.logs import LogCheckResult


class Truncation(BaseModel):
    omitted: int = Field(description="bytes left out")
    where: str = Field(description="what was left out, and where the whole data is")


class LogCheckOutput(LogCheckResult):
    source: str = Field(description="'inline text', 'stdin' or the file read")
    truncated: Truncation | None = Field(None, description="set when a large log was read in part")


def log_output(result: LogCheckResult, *, source: str, omitted: int = 0) -> LogCheckOutput:
    cut = Truncation(omitted=omitted, where=f"{source}: the bytes between the head and the tail read") if omitted \
        else None
    return LogCheckOutput(**result.model_dump(), source=source, truncated=cut)
