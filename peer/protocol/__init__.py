"""The protocol layer: what crosses the wire, independent of any HTTP library.

Envelopes and their size caps (:mod:`~peer.protocol.wire`), the strict msgpack streaming
reader (:mod:`~peer.protocol.msgpack_stream`, fed by a :mod:`~peer.protocol.source`), the
one decoder of network JSON (:mod:`~peer.protocol.strict_json`), typed protocol errors
(:mod:`~peer.protocol.errors`), swarm authentication (:mod:`~peer.protocol.auth`: request
and response signatures in :mod:`~peer.protocol.signatures`, the replay cache in
:mod:`~peer.protocol.replay_cache`, the swarm secret in :mod:`~peer.protocol.swarm_secret`,
TLS contexts in :mod:`~peer.protocol.tls`), the codec adapter over ``gossip.compression`` (:mod:`~peer.protocol.codecs`), and the
worker-thread helpers model-sized work runs in (:mod:`~peer.protocol.threads`,
:mod:`~peer.protocol.growing`). Imports nothing else of ``peer`` and never aiohttp.
"""
