"""The engine wire protocol: messages and codec, free of I/O (see docs/protocol.md)."""

from .codec import decode, encode
from .messages import (
    PROTOCOL_VERSION,
    Abort,
    ErrorInfo,
    Hello,
    Limits,
    Message,
    ModelCard,
    OutputItem,
    Outputs,
    Ping,
    Pong,
    Reject,
    Submit,
    Usage,
    Welcome,
)

__all__ = [
    "PROTOCOL_VERSION",
    "Abort",
    "ErrorInfo",
    "Hello",
    "Limits",
    "Message",
    "ModelCard",
    "OutputItem",
    "Outputs",
    "Ping",
    "Pong",
    "Reject",
    "Submit",
    "Usage",
    "Welcome",
    "decode",
    "encode",
]
