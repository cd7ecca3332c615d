"""MCP wiring of moe-overlap (see moe_overlap/server.py and docs/mcp.md).

toolkit.py    tools from pydantic input models; argument errors with field and fix
tools_skill.py / tools_verify.py   the ten tools (thin calls into skill/ and verify/)
jobs.py       verification jobs in threads with a cancel Event, owned by their session, /proc child check
stdio.py      the bounded stdio transport (a JSON-RPC error for every bad line); work.py  tool work off the loop
resources.py  the fixed-order resource registry; skills_ext.py  skills/list, skills/get (SEP-2640)
safety.py     allowed folders (files opened once), input limits; results.py  bounded results; prompts.py  enable-ep-overlap
Torch-free.
"""
