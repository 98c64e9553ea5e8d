"""Test helpers shipped with AgentNest: doubles of its own contract only.

:mod:`.contract` (the suite every backend passes), :mod:`.fake` (``FakeBackend``: scripted
replies, executes nothing), :mod:`.peer` (a hand-played agent) and :mod:`.wait`.  Doubles of
other people's systems (Kubernetes, dockerd, PostgreSQL) live in the repository's tests/doubles.
"""
