"""The engine link's transport: one task owns each socket.

ZMTP spoken by trioserve itself on the frontend, pyzmq sockets in the engine SDK.
"""
