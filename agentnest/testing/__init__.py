"""Test helpers shipped with AgentNest (for this project and third-party backends)."""
