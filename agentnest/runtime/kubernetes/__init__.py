"""The Kubernetes backend: one locked-down Pod per sandbox.

Import-light: this package loads neither ``kubernetes`` nor ``websockets``;
the modules that talk to a cluster import them on first use.  Pure parts:
:mod:`.spec` (``KubernetesSpec``), :mod:`.manifests` (the objects a sandbox
gets, as plain dicts) and :mod:`.lint` (checks a schema cannot do).

.. versionadded:: 0.4.0
"""

from .spec import KubernetesSpec

__all__ = ["KubernetesSpec"]
