"""The GPU preset: :func:`gpu_sandbox` (0.3.0's signature).

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from typing import Any

from ..errors import BackendError, ConfigurationError, ImageNotFoundError
from ..sandbox import Sandbox

__all__ = ["gpu_sandbox"]


def gpu_sandbox(image: str | None, *, gpus: int = 1, timeout: float = 300, **kwargs: Any) -> Sandbox:
    """Create a sandbox with ``gpus`` GPUs passed through.

    Args:
        image: an image with the CUDA user-space libraries the code needs
            (``None``: the default base image).
        gpus: how many GPUs (at least 1).
        timeout: the sandbox's lifetime in seconds.
        kwargs: any other :class:`~agentnest.Sandbox` argument.

    Returns:
        The running :class:`~agentnest.Sandbox`.

    On Docker the engine's host is looked at first (GPU device nodes, the
    NVIDIA Container Toolkit, gVisor's opt-in nvproxy), and a sandbox that
    cannot get its GPUs is refused before anything is created; ``agentnest
    doctor`` shows the same facts.  On Kubernetes the pod asks for
    ``nvidia.com/gpu`` (and runs in ``KubernetesSpec.gpu_runtime_class_name``
    when set).  See docs/presets.md.

    Raises:
        ConfigurationError: ``gpus`` is not a positive int (a ``ValueError``,
            as in 0.3.0).
        GPUUnavailableError: the engine cannot give GPUs here (no GPU visible,
            no NVIDIA Container Toolkit, gVisor without nvproxy), or fewer than
            ``gpus``; the message says which and how to fix it.  An
            :class:`~agentnest.UnsupportedCapabilityError`, as is the refusal of a
            backend that cannot pass GPUs through at all.
        BackendError: the engine refused the request itself (a remote engine,
            whose host cannot be looked at from here), or no GPU was free.

    .. versionchanged:: 0.4.0 GPUUnavailableError before anything is created.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
        raise ConfigurationError(f"gpus={gpus!r} must be a positive int")
    try:
        return Sandbox(image, timeout, gpus=gpus, **kwargs)
    except ImageNotFoundError:
        raise
    except BackendError as exc:
        # A remote engine's own words ("could not select device driver ...") do
        # not say what is missing; say it, and keep the engine's text.
        if "device driver" not in str(exc):
            raise
        raise BackendError(
            f"gpu_sandbox: this engine cannot pass GPUs through ({exc}); install the NVIDIA "
            "Container Toolkit on the host and restart the engine, or run on a host with a GPU"
        ) from None
