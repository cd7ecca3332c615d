"""The resources the server publishes, in a fixed order: skills, then docs, then JSON schemas.

URIs:
  skill://<skill-name>/<file>     every file of a skill folder, SKILL.md first, then card.yaml, then the
                                  rest sorted (the MCP skills extension, SEP-2640, resource mapping)
  moe-overlap://docs/<path>       the Markdown docs the card points to
  moe-overlap://schemas/<file>    the JSON Schemas (card, config, validation result, report)

The registry is built from the data folders once, at server start; a URI outside it is an error
(the SDK answers -32602 "Unknown resource"), so no client-given path ever reaches the filesystem.
Torch-free.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from moe_overlap import paths

SKILL_FIRST = ("SKILL.md", "card.yaml")
_MIME = {
    ".md": "text/markdown",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
    ".json": "application/json",
    ".txt": "text/plain",
    ".log": "text/plain",
    ".csv": "text/csv",
    ".toml": "text/plain",
    ".sh": "text/x-sh",
    ".py": "text/x-python",
}
_SKIP_NAMES = {".DS_Store", "__pycache__"}


@dataclass(frozen=True)
class Entry:
    uri: str
    path: Path
    mime_type: str
    name: str
    description: str


@dataclass(frozen=True)
class SkillFolder:
    """One skill: its SKILL.md URI, verbatim frontmatter and every file (for skills/list and skills/get)."""

    name: str
    uri: str
    frontmatter: dict
    files: tuple[Entry, ...]


def mime_for(path: Path, *, schema: bool = False) -> str:
    if schema and path.suffix == ".json":
        return "application/schema+json"
    return _MIME.get(path.suffix.lower(), "application/octet-stream")


def is_text(mime_type: str) -> bool:
    """Served as text (UTF-8); anything else goes out as a base64 blob."""
    return mime_type.startswith("text/") or mime_type in ("application/yaml", "application/json",
                                                          "application/schema+json")


def _files(folder: Path) -> list[Path]:
    out = []
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not any(part in _SKIP_NAMES or part.startswith(".") for part in p.relative_to(folder).parts):
            out.append(p)
    return out


def frontmatter(skill_md: Path) -> dict:
    """The YAML frontmatter of a SKILL.md as a dict ({} when there is none or it does not parse)."""
    text = skill_md.read_text(encoding="utf-8")
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        return {}
    try:
        data = yaml.safe_load(text[3:end])
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def skill_folders(root: Path | None = None) -> list[SkillFolder]:
    """Every folder under skills/ holding a SKILL.md, sorted by name."""
    base = root if root is not None else paths.skills_dir()
    skills = []
    for folder in sorted(p for p in base.iterdir() if (p / "SKILL.md").is_file()):
        name = folder.name
        fm = frontmatter(folder / "SKILL.md")
        files = sorted(_files(folder), key=lambda p: (
            SKILL_FIRST.index(p.name) if p.parent == folder and p.name in SKILL_FIRST else len(SKILL_FIRST),
            p.relative_to(folder).as_posix()))
        entries = []
        for p in files:
            rel = p.relative_to(folder).as_posix()
            desc = {
                "SKILL.md": str(fm.get("description", f"Agent skill {name}")),
                "card.yaml": f"Structured skill card of {name}: constraints, failure modes, examples, evidence",
            }.get(rel, f"{rel} of skill {name}")
            entries.append(Entry(uri=f"skill://{name}/{rel}", path=p, mime_type=mime_for(p),
                                 name=name if rel == "SKILL.md" else f"{name}/{rel}", description=desc))
        skills.append(SkillFolder(name=name, uri=f"skill://{name}/SKILL.md", frontmatter=fm, files=tuple(entries)))
    return skills


def registry() -> list[Entry]:
    """All published resources, in their fixed order."""
    entries: list[Entry] = []
    for skill in skill_folders():
        entries.extend(skill.files)
    docs = paths.docs_dir()
    if docs.is_dir():
        for p in _files(docs):
            if p.suffix == ".md":
                rel = p.relative_to(docs).as_posix()
                entries.append(Entry(uri=f"moe-overlap://docs/{rel}", path=p, mime_type="text/markdown",
                                     name=f"docs/{rel}", description=f"Documentation: {rel}"))
    schemas = paths.schemas_dir()
    if schemas.is_dir():
        for p in sorted(schemas.glob("*.json")):
            entries.append(Entry(uri=f"moe-overlap://schemas/{p.name}", path=p,
                                 mime_type=mime_for(p, schema=True), name=f"schemas/{p.name}",
                                 description=f"JSON Schema (2020-12): {p.name}"))
    return entries


def digest(path: Path) -> tuple[str, int]:
    """(`sha256:<hex>`, size in bytes) of a file's raw bytes, as SEP-2640 skill entries carry them."""
    data = path.read_bytes()
    return "sha256:" + hashlib.sha256(data).hexdigest(), len(data)
