"""Agent-framework integrations: a sandbox as tools for a model.

* :class:`SandboxRunner` (:mod:`.base`): framework-neutral; no extra needed.
  Give it a sandbox, or (0.3.0's form) arguments to create one it owns.
* :func:`agentnest.integrations.langchain.build_langchain_tool`: a LangChain
  ``StructuredTool`` (``pip install 'agentnest[langchain]'``).
* :class:`agentnest.integrations.smolagents.AgentNestExecutor`: a Python
  executor for smolagents' ``CodeAgent`` (``pip install 'agentnest[smolagents]'``);
  ``SandboxExecutor`` there is 0.3.0's duck-typed executor.

Importing this package, or its framework modules, loads no framework: a
framework is imported when a tool or executor needing it is built, and a
missing one raises :class:`~agentnest.MissingDependencyError` naming the extra.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from .base import RunOutput, SandboxRunner

__all__ = ["RunOutput", "SandboxRunner"]
