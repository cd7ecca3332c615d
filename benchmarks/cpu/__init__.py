"""CPU timings of the agent side: validating one config, the MCP server's start-up, a default verification's
wall time from the user's shell."""
