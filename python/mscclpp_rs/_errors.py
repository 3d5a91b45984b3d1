"""The exceptions mscclpp_rs raises: one class per kind of failure, all under :class:`Error`."""

import builtins


class Error(RuntimeError):
    """Base of every error mscclpp_rs raises; the message is the library's own."""


class InvalidUsageError(Error, ValueError):
    """The caller passed something wrong (size, rank, dtype, device, handle, configuration)."""


class SystemFailureError(Error):
    """The operating system, the GPU driver or the network failed."""


class RemoteError(Error):
    """A peer rank failed, refused us or went away (the message names the rank)."""


class TimeoutError(Error, builtins.TimeoutError):
    """A wait ran past its deadline (``MSCCLPP_BOOTSTRAP_TIMEOUT``)."""


class UnavailableError(Error):
    """What was asked for is not on this machine or not supported here (backend, device, feature)."""


class InternalError(Error):
    """A bug in mscclpp-rs: please report it with the message."""
