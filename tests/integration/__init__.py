"""Integration tests: AgentNest's claims checked against the real Docker engine."""
