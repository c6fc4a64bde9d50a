"""The transport layer: HTTP over aiohttp, on top of :mod:`peer.protocol`.

The server's endpoints and admission (:mod:`~peer.transport.server`, which names the
modules it is made of, and :mod:`~peer.transport.admission`), the client's calls (:mod:`~peer.transport.client`),
envelope bodies on the HTTP stream (:mod:`~peer.transport.body`) and the direct socket read
of model-sized bodies (:mod:`~peer.transport.receive`), and the emulated uplink every body a
peer sends may go out on (:mod:`~peer.transport.shaping`). It knows a peer only through the
``Service`` interface the server declares; it never imports :mod:`peer.node`.
"""
