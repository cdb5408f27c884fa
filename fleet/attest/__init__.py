"""``narwhal-attest``: the attestation sidecar that runs next to each real engine (spec §6.6, §11.5).

It lives with the other engine-host processes (``fleet/``: supervisor, simulator), not in the router
package: the router image needs none of it, and an engine host needs only this, the pure
``router.attestation`` model and aiohttp/httpx.
"""
