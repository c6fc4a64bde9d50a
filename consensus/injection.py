"""Byzantine injection: what Byzantine senders put in their receivers' inboxes.

One rule, two runners. The simulator replaces every Byzantine slot of all n inboxes
with :func:`byzantine_messages` (at once, or a chunk of receivers at a time); a networked peer that plays Byzantine for an
evaluation asks :func:`byzantine_message` what to send to one receiver. Both go through
the same two helpers, so a peer sends exactly what the simulator puts in the inbox:

- an attack that reads only the sender's own message (``needs_honest`` False:
  ``sign-flip``, ``gaussian``, ``scaling``, ``garbage``) is called on the sender's
  message, once per edge;
- an omniscient attack (``needs_honest``: ``alie``, ``ipm``, ``dissensus``, ``mimic``) is
  called once per receiver on the receiver's view: its own message first, then its honest
  neighbours' messages, with the receiver's mixing weights on them; all Byzantine
  neighbours of that receiver collude and send the one vector it returns.

What the attack is told about receiver i, with B_i its present Byzantine neighbours:
``byzantine_weight = Σ_{b ∈ B_i} W_ib``, the TOTAL weight, as dissensus needs (He,
Karimireddy & Jaggi 2022: with ε = 1 under plain averaging i then stays exactly where it
was however many Byzantine neighbours it has); and ALIE (Baruch, Baruch & Goldberg 2019)
is run as ``attack.for_neighbourhood(n, f)`` with i's real ``n = 1 + present
neighbours`` and ``f = |B_i|``, so z = Φ⁻¹((n − f − s)/(n − f)) comes from i's actual
neighbourhood (unless its ``z`` is fixed; where the formula is undefined, a Byzantine
majority at i with s <= 0, the attack runs as configured).
"""

from __future__ import annotations

import torch
from torch import Tensor

from consensus.attacks import Attack


def byzantine_messages(
    attack: Attack,
    sent: Tensor,
    received: Tensor,
    index: Tensor,
    weights: Tensor,
    mask: Tensor,
    byzantine: Tensor,
    generator: torch.Generator | None = None,
    *,
    receivers: Tensor | None = None,
) -> Tensor:
    """``received [n, k, m]`` with every slot whose sender is Byzantine replaced by the attack.

    Args:
        attack: what Byzantine senders send (``consensus.build_attack(spec)``).
        sent: ``[n, m]``, what each node sends when honest (row i is receiver i's own
            message too).
        received: ``[n, k, m]``, receiver i's inbox, ``received[i, p] = sent[index[i, p]]``.
        index: ``[n, k]`` long, the sender of each slot.
        weights: ``[n, k]``, receiver i's mixing weights W_ij on its slots.
        mask: ``[n, k]`` bool, True where the slot is present.
        byzantine: ``[n]`` bool, True for Byzantine nodes.
        generator: randomness for stochastic attacks (default: the attack's own).
        receivers: ``[r]`` long, the node whose inbox each row of ``received``, ``index``,
            ``weights`` and ``mask`` is (then ``[r, k, m]`` and ``[r, k]``), for a runner that
            streams a chunk of receivers at a time; ``sent`` and ``byzantine`` still cover
            all n nodes. Default: row i is node i. Each receiver's slots get what they would
            get in one call over all n (a stochastic attack draws its noise per call).

    An attack that needs nothing but the sender's own message is called once on all
    Byzantine slots ``[s, m]``. An omniscient one is called once for all receivers that have
    Byzantine neighbours (once per group of receivers that ``attack.for_neighbourhood``
    tells apart, e.g. per distinct (n, f) for ALIE): it sees each receiver's own message and
    its honest neighbours' messages, and the colluding Byzantine neighbours of that receiver
    all send the one vector it returns.

    What the attack is told about receiver i, with B_i its present Byzantine neighbours:
    ``byzantine_weight = Σ_{b ∈ B_i} W_ib`` (the TOTAL weight, as dissensus needs: with ε = 1
    and plain averaging, i stays exactly where it was however many Byzantine neighbours it
    has; He, Karimireddy & Jaggi 2022), and ALIE (Baruch et al. 2019; unless its ``z`` is
    fixed) gets the real ``f = |B_i|`` and ``n = 1 + present neighbours``, so
    z = Φ⁻¹((n − f − s)/(n − f)) comes from i's actual neighbourhood; where that formula is
    undefined (Byzantine majority at i, s <= 0) the attack runs as configured.

    Returns ``received`` itself (the same tensor object, not a copy) when no present slot has
    a Byzantine sender, else a new tensor; honest slots are copied bit for bit. Raises
    ``ValueError`` when the attack's messages do not have length m (``garbage:kind=
    wrong-length`` cannot enter an inbox; a peer sends it with :func:`byzantine_message`).
    """
    _check_inboxes(sent, received, index, weights, mask, byzantine, receivers)
    slots = mask & byzantine[index]
    inboxes, positions = slots.nonzero(as_tuple=True)
    if inboxes.numel() == 0:
        return received
    if not attack.needs_honest:
        malicious = _per_edge(attack, sent[index[inboxes, positions]], generator)
    else:
        rows = slots.any(dim=1).nonzero().squeeze(1)
        first = slots[rows].to(torch.int8).argmax(dim=1)  # the colluders share one vector
        per_receiver = _per_receiver(
            attack,
            own=sent[index[rows, first]],
            target=sent[rows if receivers is None else receivers[rows]],
            honest=received[rows],
            honest_mask=(mask & ~byzantine[index])[rows],
            honest_weights=weights[rows],
            byzantine_weight=torch.where(slots, weights, 0.0)[rows].sum(-1),
            byzantine_count=slots[rows].sum(dim=1),
            generator=generator,
        )
        per_row = torch.zeros(received.shape[0], dtype=torch.long, device=rows.device)
        per_row[rows] = torch.arange(rows.numel(), device=rows.device)
        malicious = per_receiver[per_row[inboxes]]
    if malicious.shape != (inboxes.numel(), received.shape[-1]):
        raise ValueError(
            f"attack: {attack!r} sent messages of shape {list(malicious.shape[1:])} but the "
            f"inboxes hold messages of shape [{received.shape[-1]}]; a message of another "
            "length cannot enter a batched inbox (a peer sends it with byzantine_message)"
        )
    out = received.clone()
    out[inboxes, positions] = malicious.to(out.dtype)
    return out


def byzantine_message(
    attack: Attack,
    own: Tensor,
    *,
    target: Tensor | None = None,
    honest: Tensor | None = None,
    honest_mask: Tensor | None = None,
    honest_weights: Tensor | None = None,
    byzantine_weight: Tensor | float | None = None,
    byzantine_count: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """What one Byzantine node sends to one receiver i: the rule of :func:`byzantine_messages`
    for a batch of one (the same helpers run, so a peer and the simulator agree).

    Args:
        attack: what the node sends (``consensus.build_attack(spec)``).
        own: ``[m]``, the message the node would have sent to i if it were honest.
        target: ``[m]``, receiver i's own message.
        honest: ``[h, m]``, the messages i receives from its honest neighbours this round
            (i's own message is NOT a row: it is ``target``); ``[0, m]`` when it has none.
        honest_mask: ``[h]`` bool, True where that honest neighbour's message is present
            (default: all).
        honest_weights: ``[h]``, i's mixing weights W_ij on those honest neighbours.
        byzantine_weight: Σ_{b ∈ B_i} W_ib, the TOTAL weight i puts on its present Byzantine
            neighbours, this node included (float or 0-dim tensor).
        byzantine_count: |B_i| >= 1, how many present Byzantine neighbours i has, this node
            included (ALIE's f; its n is 1 + present honest + byzantine_count).
        generator: randomness for stochastic attacks (default: the attack's own).

    An attack that reads only ``own`` (``needs_honest`` False) ignores the other arguments
    and may be called with ``own`` alone. An omniscient attack (``alie``, ``ipm``,
    ``dissensus``, ``mimic``) needs ``target``, ``honest``, ``honest_weights``,
    ``byzantine_weight`` and ``byzantine_count``: it sees what
    :func:`byzantine_messages` shows it, i's own message first and then its honest
    neighbours', with weights ``[w_ii, W_ij...]`` where w_ii = 1 − Σ_j honest W_ij −
    byzantine_weight, and z (ALIE) from i's real (n, f). Every Byzantine neighbour of i that
    calls this with the same view sends the same vector, as the colluders of the simulator
    do. Returns ``[m]``, or whatever length the attack sends (``garbage:kind=wrong-length``
    sends ``[m + 1]``, for exercising a receiver's wire validation).
    """
    if not isinstance(own, Tensor) or not own.is_floating_point() or own.ndim != 1:
        raise ValueError(
            "byzantine_message: own must be a floating-point tensor of shape [m], got "
            f"{_describe(own)}"
        )
    if not attack.needs_honest:
        return _per_edge(attack, own.unsqueeze(0), generator)[0]
    if (
        target is None
        or honest is None
        or honest_weights is None
        or byzantine_weight is None
        or byzantine_count is None
    ):
        raise ValueError(
            f"byzantine_message: {attack!r} needs target [m], honest [h, m], honest_weights "
            "[h], byzantine_weight and byzantine_count (the receiver's view)"
        )
    m = own.shape[0]
    if not isinstance(target, Tensor) or target.shape != (m,):
        raise ValueError(
            f"byzantine_message: target must have shape [{m}], got {_describe(target)}"
        )
    if not isinstance(honest, Tensor) or honest.ndim != 2 or honest.shape[1] != m:
        raise ValueError(
            f"byzantine_message: honest must have shape [h, {m}], got {_describe(honest)}"
        )
    h = honest.shape[0]
    if honest_mask is None:
        honest_mask = torch.ones(h, dtype=torch.bool, device=honest.device)
    elif (
        not isinstance(honest_mask, Tensor)
        or honest_mask.dtype != torch.bool
        or honest_mask.shape != (h,)
    ):
        raise ValueError(
            f"byzantine_message: honest_mask must be a bool tensor of shape [{h}], got "
            f"{_describe(honest_mask)}"
        )
    if not isinstance(honest_weights, Tensor) or honest_weights.shape != (h,):
        raise ValueError(
            f"byzantine_message: honest_weights must have shape [{h}], got "
            f"{_describe(honest_weights)}"
        )
    total = torch.as_tensor(byzantine_weight, dtype=honest_weights.dtype, device=own.device)
    if total.ndim != 0 or not bool(torch.isfinite(total)) or float(total) < 0:
        raise ValueError(
            "byzantine_message: byzantine_weight must be one finite number >= 0 (the "
            f"receiver's total weight on its Byzantine neighbours), got {byzantine_weight!r}"
        )
    if (
        isinstance(byzantine_count, bool)
        or not isinstance(byzantine_count, int)
        or byzantine_count < 1
    ):
        raise ValueError(
            "byzantine_message: byzantine_count must be an integer >= 1 (the receiver's "
            f"present Byzantine neighbours, this node included), got {byzantine_count!r}"
        )
    return _per_receiver(
        attack,
        own=own.unsqueeze(0),
        target=target.unsqueeze(0),
        honest=honest.unsqueeze(0),
        honest_mask=honest_mask.unsqueeze(0),
        honest_weights=honest_weights.unsqueeze(0),
        byzantine_weight=total.unsqueeze(0),
        byzantine_count=torch.tensor([byzantine_count], device=own.device),
        generator=generator,
    )[0]


def _per_edge(attack: Attack, own: Tensor, generator: torch.Generator | None) -> Tensor:
    """``[s, m]``: an attack that reads only the sender's message, once per edge."""
    return attack(own, generator=generator)


def _per_receiver(
    attack: Attack,
    *,
    own: Tensor,
    target: Tensor,
    honest: Tensor,
    honest_mask: Tensor,
    honest_weights: Tensor,
    byzantine_weight: Tensor,
    byzantine_count: Tensor,
    generator: torch.Generator | None,
) -> Tensor:
    """``[r, m]``: an omniscient attack's one vector per receiver, from each receiver's view.

    ``own [r, m]`` (a colluding sender's message), ``target [r, m]``, ``honest [r, h, m]``,
    ``honest_mask [r, h]``, ``honest_weights [r, h]``, ``byzantine_weight [r]``,
    ``byzantine_count [r]``. The attack sees ``[target, honest...]`` with weights
    ``[w_ii, W_ij...]``, w_ii = 1 − Σ present honest W_ij − byzantine_weight.
    """
    present = torch.where(honest_mask, honest_weights, 0.0)
    self_weight = 1.0 - present.sum(-1) - byzantine_weight.to(present.dtype)
    view = torch.cat([target.unsqueeze(1), honest], dim=1)
    own_row = torch.ones(target.shape[0], 1, dtype=torch.bool, device=honest_mask.device)
    visible = torch.cat([own_row, honest_mask], dim=1)
    view_weights = torch.cat([self_weight.unsqueeze(1), present], dim=1)
    sizes = honest_mask.sum(dim=1) + byzantine_count + 1
    groups = _attack_groups(attack, sizes, byzantine_count)
    if len(groups) == 1:
        return groups[0][0](
            own,
            view,
            honest_mask=visible,
            target=target,
            honest_weights=view_weights,
            byzantine_weight=byzantine_weight,
            generator=generator,
        )
    pieces = [
        chosen(
            own[group],
            view[group],
            honest_mask=visible[group],
            target=target[group],
            honest_weights=view_weights[group],
            byzantine_weight=byzantine_weight[group],
            generator=generator,
        )
        for chosen, group in groups
    ]
    out = pieces[0].new_empty((target.shape[0], *pieces[0].shape[1:]))
    for (_, group), piece in zip(groups, pieces, strict=True):
        out[group] = piece.to(out.dtype)
    return out


def _attack_groups(attack: Attack, sizes: Tensor, counts: Tensor) -> list[tuple[Attack, Tensor]]:
    """The attack for each group of receivers: ``attack.for_neighbourhood(n, f)`` per distinct
    (n = own + present neighbours, f = present Byzantine neighbours), receivers whose
    variants are the same object merged into one group (one group for most attacks)."""
    pairs = torch.stack([sizes, counts], dim=1)
    unique, group_of = pairs.unique(dim=0, return_inverse=True)
    variants: list[Attack] = []
    members: list[list[int]] = []
    for position, (n, f) in enumerate(unique.tolist()):
        variant = attack.for_neighbourhood(n, f)
        for j, seen in enumerate(variants):
            if seen is variant:
                members[j].append(position)
                break
        else:
            variants.append(variant)
            members.append([position])
    if len(variants) == 1:
        return [(variants[0], torch.arange(sizes.numel(), device=sizes.device))]
    return [
        (
            variant,
            torch.isin(group_of, torch.tensor(positions, device=group_of.device))
            .nonzero()
            .squeeze(1),
        )
        for variant, positions in zip(variants, members, strict=True)
    ]


def _check_inboxes(
    sent: Tensor,
    received: Tensor,
    index: Tensor,
    weights: Tensor,
    mask: Tensor,
    byzantine: Tensor,
    receivers: Tensor | None = None,
) -> None:
    """Shapes and dtypes of :func:`byzantine_messages`' table (no device synchronisation)."""
    if received.ndim != 3:
        raise ValueError(f"received must have shape [n, k, m], got {list(received.shape)}")
    r, k, m = received.shape
    n = r if receivers is None else sent.shape[0]
    if receivers is not None and (
        receivers.shape != (r,) or receivers.dtype not in (torch.int32, torch.int64)
    ):
        raise ValueError(
            f"receivers must be an integer tensor of shape [{r}] (one node per inbox row), "
            f"got {_describe(receivers)}"
        )
    if sent.shape != (n, m):
        raise ValueError(f"sent must have shape [{n}, {m}] like received, got {list(sent.shape)}")
    for name, tensor in (("index", index), ("weights", weights), ("mask", mask)):
        if tensor.shape != (r, k):
            raise ValueError(f"{name} must have shape [{r}, {k}], got {list(tensor.shape)}")
    if mask.dtype != torch.bool or byzantine.dtype != torch.bool or byzantine.shape != (n,):
        raise ValueError(
            f"mask must be a bool tensor [{r}, {k}] and byzantine a bool tensor [{n}], got "
            f"{mask.dtype} and {byzantine.dtype} {list(byzantine.shape)}"
        )


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"{value.dtype} {list(value.shape)}"
    return repr(value)
