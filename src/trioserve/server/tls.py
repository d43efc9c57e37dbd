"""TLS options: the server's ``ssl.SSLContext``, built once from the settings.

The built-in server wraps each accepted connection in ``trio.SSLStream`` with this
context; hypercorn builds its own from the same files (``server/hypercorn.py``), and
offers HTTP/2 on it through ALPN. With ``ssl_ca_certs``, clients are asked for a
certificate signed by one of those CAs (mutual TLS): required, or optional.
"""

from __future__ import annotations

import ssl

from ..config import Settings

#: ``--ssl-client-cert`` values, as OpenSSL's verify modes (only with ``--ssl-ca-certs``).
CLIENT_CERT_MODES = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL}


def enabled(settings: Settings) -> bool:
    return bool(settings.ssl_certfile)


def server_context(settings: Settings, alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLContext:
    """The server side's context: TLS 1.2 or later, Python's default ciphers for a server
    (``create_default_context``: no compression, forward secrecy), the certificate chain
    and key, and the client CAs if any. Raises ``OSError`` for a file that cannot be read
    and ``ssl.SSLError`` for one that is not what it should be (a key that does not
    match its certificate, say)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile or None)
    if settings.ssl_ca_certs:
        context.load_verify_locations(settings.ssl_ca_certs)
        context.verify_mode = CLIENT_CERT_MODES[settings.ssl_client_cert]
    context.set_alpn_protocols(list(alpn))
    return context
