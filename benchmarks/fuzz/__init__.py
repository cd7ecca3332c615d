"""Hostile input to every CLI command and MCP tool: the generators (fuzz_inputs), the runners (fuzz_exec for
the CLI, fuzz_mcp for the MCP tools), what a run counts (tally) and the script that runs them all (fuzz)."""
