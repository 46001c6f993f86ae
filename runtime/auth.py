"""Bearer-token authentication of the v2, OpenAI and gRPC routes (``server.bearer_token_env``).

Off by default. When ``server.bearer_token_env`` names an environment variable (the operator fills it
from a Secret with ``secretKeyRef``: the token is never in the ConfigMap), every route but the health
routes (``/v2/health/live``, ``/v2/health/ready``, gRPC ``ServerLive``/``ServerReady``: the kubelet's
probes) and ``/metrics`` (Prometheus; keep it to the cluster with a NetworkPolicy) requires
``Authorization: Bearer <token>`` (gRPC: the ``authorization`` metadata). A missing or wrong token is
401 (gRPC ``UNAUTHENTICATED``) with ``WWW-Authenticate: Bearer``; the message never repeats what the
client sent. Tokens are compared in constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping

from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.errors import HTTPError

#: The header of a 401 (RFC 6750).
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="kubeinfer"'}


class BearerAuth:
    """The token check of one process, or no check (``token`` None).

    Args:
        token: the token every protected request must carry, or None for no authentication.
    """

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token is not None else None

    @classmethod
    def from_config(cls, cfg: RuntimeConfig, environ: Mapping[str, str] = os.environ) -> BearerAuth:
        """The check ``cfg.server.bearer_token_env`` asks for.

        Raises:
            ValueError: the variable it names is unset or empty (the runtime refuses to start open
                when authentication was asked for).
        """
        name = cfg.server.bearer_token_env
        if name is None:
            return cls(None)
        token = environ.get(name, "")
        if not token.strip():
            raise ValueError(f"server.bearer_token_env names {name}, which is not set or empty")
        return cls(token.strip())

    @property
    def enabled(self) -> bool:
        """True when requests must carry the token."""
        return self._token is not None

    def check(self, authorization: str | None) -> None:
        """Accept an ``Authorization`` header value that is ``Bearer <the token>``.

        Raises:
            HTTPError: 401 (with ``WWW-Authenticate``) when it is missing, of another scheme or wrong.
        """
        if self._token is None:
            return
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise HTTPError("this server requires 'Authorization: Bearer <token>'", 401, CHALLENGE)
        if not hmac.compare_digest(credentials.strip().encode(), self._token):
            raise HTTPError("the bearer token is not valid for this server", 401, CHALLENGE)
