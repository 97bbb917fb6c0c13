"""Kopf's HTTP session to the API server, made by our login handler so that its requests are counted
(rest_client_requests_total): Kopf's own login from the client library's config, on a session we build
(kopf.AiohttpSession, Kopf's documented way to bring one) with aiohttp's request tracing added."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import aiohttp
import kopf


def counted_session(info: kopf.ConnectionInfo, trace: aiohttp.TraceConfig) -> aiohttp.ClientSession:
    """The session Kopf would build from `info` (TLS, token or client certificate, proxy), with `trace` on it."""
    with warnings.catch_warnings():  # Kopf's own deprecation note on basic auth, which it silences the same way
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="kopf")
        auth = info.as_aiohttp_basic_auth()
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        auth=auth,
        proxy=info.proxy_url,
        trust_env=info.trust_env,
        trace_configs=[trace],
    )


async def counted_login(
    logger: Any, settings: kopf.OperatorSettings, trace: aiohttp.TraceConfig
) -> kopf.AiohttpSession | None:
    """Kopf's login_via_client (in-cluster service account, else kubeconfig: as `Kube.from_environment`), on a
    counted session; Kopf closes the session when the credentials are replaced or the operator stops."""
    info = await asyncio.to_thread(kopf.login_via_client, logger=logger, settings=settings)
    if info is None:
        return None
    return kopf.AiohttpSession(
        aiohttp_session=counted_session(info, trace),
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
    )
