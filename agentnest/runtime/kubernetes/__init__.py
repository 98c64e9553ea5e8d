"""The Kubernetes backend: one locked-down Pod per sandbox.

Import-light: this package loads neither ``kubernetes`` nor ``websockets``;
the modules that talk to a cluster import them on first use.  Pure parts:
:mod:`.spec` (``KubernetesSpec``), :mod:`.manifests` (the objects a sandbox
gets, as plain dicts) and :mod:`.lint` (checks a schema cannot do).

``KubernetesRuntime`` is 0.3.0's name of the backend (same keywords:
``namespace=``, ``context=``, ``runtime_class_name=``).

.. versionadded:: 0.4.0
"""

from .backend import KubernetesBackend
from .spec import KubernetesSpec

KubernetesRuntime = KubernetesBackend
"""0.3.0's name of :class:`KubernetesBackend`."""

__all__ = ["KubernetesBackend", "KubernetesRuntime", "KubernetesSpec"]
