"""The MCP skills extension (`io.modelcontextprotocol/skills`, SEP-2640): `skills/list` and `skills/get`.

A skill entry carries the URI of its SKILL.md, the frontmatter verbatim, and every file of the skill
with its sha256 digest and size, so a host can verify what it later reads through `resources/read`.
The files themselves are served as ordinary resources (see resources.py). `directoryRead` is not
offered. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from mcp.server.mcpserver import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    CacheableResult,
    PaginatedRequestParams,
    PaginatedResult,
    Request,
    RequestParams,
)
from pydantic import BaseModel, Field

from moe_overlap.mcp.resources import SkillFolder, digest

IDENTIFIER = "io.modelcontextprotocol/skills"
TTL_MS = 300_000  # the files ship with the package: they only change on upgrade


class SkillResource(BaseModel):
    uri: str
    digest: str
    size: int


class SkillEntry(BaseModel):
    uri: str
    frontmatter: dict[str, Any]
    resources: list[SkillResource]


class ListSkillsResult(PaginatedResult, CacheableResult):
    result_type: Literal["complete"] = "complete"
    skills: list[SkillEntry]


class GetSkillParams(RequestParams):
    uri: str = Field(description="URI of the skill's SKILL.md")


class GetSkillResult(CacheableResult):
    result_type: Literal["complete"] = "complete"
    skill: SkillEntry


class ListSkillsRequest(Request[PaginatedRequestParams | None, Literal["skills/list"]]):
    """Client side of `skills/list` (for `ClientSession.send_request`)."""

    method: Literal["skills/list"] = "skills/list"
    params: PaginatedRequestParams | None = None


class GetSkillRequest(Request[GetSkillParams, Literal["skills/get"]]):
    method: Literal["skills/get"] = "skills/get"
    params: GetSkillParams


def entry(skill: SkillFolder) -> SkillEntry:
    files = []
    for f in skill.files:
        d, size = digest(f.path)
        files.append(SkillResource(uri=f.uri, digest=d, size=size))
    return SkillEntry(uri=skill.uri, frontmatter=skill.frontmatter, resources=files)


class SkillsExtension(Extension):
    identifier = IDENTIFIER

    def __init__(self, skills: Sequence[SkillFolder]):
        self._skills = {s.uri: s for s in skills}

    def settings(self) -> dict[str, Any]:
        return {}

    def methods(self) -> Sequence[MethodBinding]:
        return (MethodBinding("skills/list", PaginatedRequestParams, self._list),
                MethodBinding("skills/get", GetSkillParams, self._get))

    async def _list(self, ctx: Any, params: Any) -> ListSkillsResult:
        # One page: the server publishes a handful of skills, never enough to paginate.
        return ListSkillsResult(skills=[entry(s) for s in self._skills.values()], ttl_ms=TTL_MS,
                                cache_scope="public")

    async def _get(self, ctx: Any, params: GetSkillParams) -> GetSkillResult:
        skill = self._skills.get(params.uri)
        if skill is None:
            raise MCPError(code=INVALID_PARAMS,
                           message=f"uri: {params.uri!r} is not a skill served here; "
                                   f"known skills: {', '.join(self._skills) or 'none'}")
        return GetSkillResult(skill=entry(skill), ttl_ms=TTL_MS, cache_scope="public")

