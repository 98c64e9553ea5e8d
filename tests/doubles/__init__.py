"""Test doubles of other people's systems: Kubernetes, a private dockerd, PostgreSQL, an unsandboxed agent.

They live here, not in the wheel: they double systems AgentNest does not own, some need
dev-only dependencies (aiohttp), and none is a promise to users.  The doubles of AgentNest's
own contract ship in :mod:`agentnest.testing`.  Importable as ``doubles.*``: pyproject.toml's
pytest ``pythonpath`` puts tests/ on ``sys.path``, and benchmarks/harness.py does the same.
"""
