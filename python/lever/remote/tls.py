"""TLS for edge-cloud mode: the server's context (certificate and key) and
the client's (which certificates it trusts).  Errors are one-line LeverErrors
naming the option and the file."""

from __future__ import annotations

import ssl

from ..errors import LeverError
from ..files import require_regular


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 or later) from a PEM certificate chain and its private key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    require_regular(cert_file, f"--tls-cert {cert_file}")      # OpenSSL would block on a FIFO
    require_regular(key_file, f"--tls-key {key_file}")
    try:
        context.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as e:
        raise LeverError(f"--tls-cert/--tls-key: {e.filename} cannot be read ({e.strerror})") from None
    except (OSError, ssl.SSLError) as e:
        raise LeverError(f"--tls-cert {cert_file} / --tls-key {key_file}: not a PEM certificate chain and its "
                         f"private key ({getattr(e, 'reason', None) or e})") from None
    return context


def client_context(ca_file: str | None = None) -> ssl.SSLContext:
    """A verifying TLS client context: the system's trusted certificates, or
    only those in `ca_file` (PEM) when given -- e.g. a self-signed server certificate."""
    if ca_file is not None:
        require_regular(ca_file, f"--tls-ca {ca_file}")
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except FileNotFoundError as e:
        raise LeverError(f"--tls-ca {ca_file}: cannot be read ({e.strerror})") from None
    except (OSError, ssl.SSLError) as e:
        raise LeverError(f"--tls-ca {ca_file}: not a PEM certificate file ({getattr(e, 'reason', None) or e})") \
            from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
