"""HTTP plumbing shared by Lever's aiohttp servers, `lever serve-verifier`
(lever.remote.server) and `lever serve` (lever.serve.app).

- `error`: `HttpError` (no aiohttp: the edge-cloud protocol builds on it);
- `json_body`: request bodies parsed, and every string in them checked to be
  valid Unicode (the field at fault named), for both servers' 400s;
- `connections`: `ConnectionGuard`, the connection limits below aiohttp;
- `common`: bearer tokens, bounded body reads, the guard middleware, the
  guarded TCP site and running it on a thread;
- `shutdown`: serving until SIGINT or SIGTERM, then the one bounded drain;
- `address`: loopback hosts and URLs (an IPv6 host in brackets), no aiohttp;
- `logs`: aiohttp's access and server logs fed to a server's counters and log.

Sizes are bytes, times seconds.
"""
