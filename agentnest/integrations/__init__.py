"""Agent-framework integrations: a sandbox as tools for a model.

* :class:`SandboxRunner` (:mod:`.base`): framework-neutral; no extra needed.
* :func:`agentnest.integrations.langchain.build_langchain_tool`: a LangChain
  ``StructuredTool`` (``pip install 'agentnest[langchain]'``).
* :class:`agentnest.integrations.smolagents.AgentNestExecutor`: a Python
  executor for smolagents' ``CodeAgent`` (``pip install 'agentnest[smolagents]'``).

Importing this package loads neither framework; their modules import them
and raise :class:`~agentnest.MissingDependencyError` naming the extra.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from .base import RunOutput, SandboxRunner

__all__ = ["RunOutput", "SandboxRunner"]
