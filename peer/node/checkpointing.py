"""A peer's checkpoints: what it writes at ``checkpoint_every`` steps and at stop, and resume.

Each checkpoint (:func:`peer.node.training_state.save_training_state`: the model, its
buffers and the optimizer) records beside the model the membership view (ids and
addresses, metadata ``members``) and the model recipe if the peer has one; ``resume``
restores the newest checkpoint that verifies and reads back the round and the remembered
member addresses, which the peer rejoins at start.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from gossip.outer import CheckpointedState
from peer.node.checkpoint import remove_stale_temporaries
from peer.node.context import PeerContext
from peer.node.membership import check_address
from peer.node.recipe import RECIPE_KEY, ModelRecipe
from peer.node.training_state import (
    algorithm_tensors,
    load_training_state,
    save_training_state,
)
from peer.protocol import strict_json
from peer.protocol.errors import ProtocolError
from peer.protocol.wire import check_sender

logger = logging.getLogger(__name__)

MEMBERS_KEY = "members"
"""The checkpoint metadata key holding the membership view: JSON ``[{id, address}, ...]``."""


class Checkpointing:
    """Checkpoints of one peer (``PeerConfig.checkpoint_dir``), over its shared parts ``ctx``.

    Attributes:
        recipe: how ``workloads`` rebuilds the model (recorded in every checkpoint), or None.
        resumed_from: the checkpoint :meth:`resume` restored, or None.
        remembered_members: addresses of the members that checkpoint recorded.
    """

    def __init__(self, ctx: PeerContext, recipe: ModelRecipe | None) -> None:
        self.ctx = ctx
        self.recipe = recipe
        self.resumed_from: Path | None = None
        self.remembered_members: tuple[str, ...] = ()
        self._last_step = -1
        """The step of the last checkpoint written or resumed (none is due again then)."""

    @property
    def due_at_stop(self) -> bool:
        """Whether ``stop`` writes one: a directory is set and the last one is older."""
        return self.ctx.config.checkpoint_dir is not None and self.ctx.step != self._last_step

    def remove_stale_temporaries(self) -> None:
        """Delete what a write killed midway left in the directory (if one is set)."""
        if self.ctx.config.checkpoint_dir is not None:
            remove_stale_temporaries(self.ctx.config.checkpoint_dir)

    def save(self) -> Path:
        """Write a checkpoint now; takes the model lock (call it in a worker thread)."""
        with self.ctx.lock:
            return self.save_locked()

    def after_step_locked(self) -> None:
        """Write the checkpoint the step just taken is due for (``checkpoint_every``), with
        the model lock held."""
        every = self.ctx.config.checkpoint_every
        if every and self.ctx.step % every == 0:
            self.save_locked()

    def save_locked(self) -> Path:
        """Write a checkpoint of the model, the optimizer, the members and the recipe, with
        the model lock held; returns its path."""
        ctx = self.ctx
        directory = ctx.config.checkpoint_dir
        if directory is None:
            raise RuntimeError("PeerConfig.checkpoint_dir is not set")
        members = [
            {"id": m.id, "address": m.address}
            for m in ctx.membership.members("alive", "suspected", "left")
            if m.address is not None  # a member that left may be back when we resume
        ]
        metadata = {MEMBERS_KEY: json.dumps(members)}
        if self.recipe is not None:
            metadata[RECIPE_KEY] = json.dumps(self.recipe.to_json())
        state = ctx.gossip_state
        path = save_training_state(
            ctx.trainer,
            directory,
            round=ctx.round,
            peer_id=ctx.peer_id,
            keep=ctx.config.keep_checkpoints,
            metadata=metadata,
            algorithm=state.tensors() if isinstance(state, CheckpointedState) else None,
        )
        self._last_step = ctx.step
        return path

    def resume(self) -> None:
        """Restore the newest checkpoint that verifies (model, optimizer, step, round) and
        remember its members; with none, log a warning and start from scratch."""
        ctx = self.ctx
        directory = ctx.config.checkpoint_dir
        if directory is None:
            raise RuntimeError("PeerConfig.checkpoint_dir is not set")
        loaded = load_training_state(ctx.trainer, directory)
        if loaded is None:
            logger.warning(
                "peer %s: resume found no checkpoint (checkpoint-*.safetensors) in %s; "
                "starting from scratch at step 0",
                ctx.peer_id,
                Path(directory).resolve(),
            )
            return
        if isinstance(ctx.gossip_state, CheckpointedState):
            saved = algorithm_tensors(loaded)
            if saved:
                with ctx.lock:
                    ctx.gossip_state.load(saved)
            else:
                logger.warning(
                    "peer %s: %s holds no %s state (slow weights); they restart from the model",
                    ctx.peer_id,
                    loaded.path,
                    ctx.config.algorithm,
                )
        ctx.round = loaded.round
        self._last_step = loaded.step
        self.resumed_from = loaded.path
        self.remembered_members = remembered_members(loaded.metadata.get(MEMBERS_KEY), loaded.path)
        logger.info(
            "peer %s resumed from %s (step %d, %d remembered members)",
            ctx.peer_id,
            loaded.path,
            loaded.step,
            len(self.remembered_members),
        )


def remembered_members(text: str | None, path: Path) -> tuple[str, ...]:
    """The member addresses a checkpoint's ``members`` metadata lists; entries that are not
    ``{id, address}`` with a valid ``HOST:PORT`` are skipped (logged once). Checkpoints
    written before members were recorded have none."""
    if text is None:
        return ()
    try:
        entries = strict_json.loads(text.encode(), what=f"{path} members", max_bytes=1 << 20)
    except ProtocolError as error:
        logger.warning("ignoring the members recorded in %s: %s", path, error)
        return ()
    addresses: list[str] = []
    skipped = 0
    for entry in entries if isinstance(entries, list) else [entries]:
        try:
            check_sender(entry["id"])
            addresses.append(check_address(entry["address"]))
        except (TypeError, KeyError, ValueError, ProtocolError):
            skipped += 1
    if skipped:
        logger.warning("ignoring %d malformed member entries recorded in %s", skipped, path)
    return tuple(dict.fromkeys(addresses))
