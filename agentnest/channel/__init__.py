"""The host's end of the agent protocol."""

from .client import Channel, ExecHandle, RawExit
from .streams import ByteStream, DockerMuxStream, SocketStream

__all__ = ["ByteStream", "Channel", "DockerMuxStream", "ExecHandle", "RawExit", "SocketStream"]
