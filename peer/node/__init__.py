"""The node layer: one peer, built on :mod:`peer.transport` and :mod:`peer.protocol`.

:class:`~peer.node.peer.Peer` and its configuration (:mod:`~peer.node.config`), the
exchange modes (:mod:`~peer.node.sync_round`, :mod:`~peer.node.pairwise`), membership and
topology, the trainer, health, metrics, checkpoints and the training record
(:mod:`~peer.node.logbook`), and :class:`~peer.node.background.BackgroundPeer`.
"""
