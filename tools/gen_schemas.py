#!/usr/bin/env python3
"""Regenerate schemas/*.json from their pydantic models (moe_overlap.skill.card.schemas.SCHEMA_MODELS), and the
MCP tools' published input schemas (moe_overlap/mcp/tool_inputs.json, from moe_overlap.mcp.catalog).

    python tools/gen_schemas.py          # write
    python tools/gen_schemas.py --check  # exit 1 if any committed schema is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moe_overlap.mcp import catalog  # noqa: E402
from moe_overlap.skill.card.schemas import SCHEMA_MODELS, generate_schema, render  # noqa: E402

ROOT = Path(__file__).resolve().parents[1] / "schemas"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only check, write nothing")
    args = ap.parse_args()
    stale = []
    for name in SCHEMA_MODELS:
        text = render(generate_schema(name))
        path = ROOT / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
            if not args.check:
                path.write_text(text, encoding="utf-8")
    tool_inputs = catalog.render(catalog.generate())
    if not catalog.FILE.exists() or catalog.FILE.read_text(encoding="utf-8") != tool_inputs:
        stale.append(catalog.FILE.name)
        if not args.check:
            catalog.FILE.write_text(tool_inputs, encoding="utf-8")
    if args.check and stale:
        print("stale schemas (run python tools/gen_schemas.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    print(("checked " if args.check else "wrote ") + ", ".join(SCHEMA_MODELS) if SCHEMA_MODELS else "no schemas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
