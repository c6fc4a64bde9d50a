"""The algorithm settings, each declared once: :data:`SETTINGS`.

A :class:`Setting` holds everything about one setting that a runner, a command line or the
docs need: its name, type, default (per algorithm where it differs), allowed values and the
check that enforces them, its help text, which algorithms read it (and which fix it), and
its command-line flag (the name with dashes). Everything else is derived from this table:

* :class:`gossip.configuration.GossipConfig`'s fields, defaults and validation, and the
  rule that a setting the chosen algorithm does not read is an error;
* the simulator's ``[algorithm]`` keys (``sim.config.AlgorithmConfig``) and the peer's
  algorithm fields (``peer.node.config.PeerConfig``), both through :func:`setting_fields`;
* the ``gossipnet peer`` and ``gossipnet launch`` flags and launch's pass-through to its
  peers (:func:`flag_arguments`);
* the table in ``docs/settings.md`` (:func:`settings_markdown`; regenerate it with
  ``python -m gossip.settings_doc > docs/settings.md``).

Adding a setting is one :class:`Setting` in :data:`SETTINGS` plus its use in the rule
(:func:`gossip.configuration.build_algorithm`).

An invalid value raises :class:`ConfigurationError`, which carries the field it is about, so
that each front end names the field its own way (``algorithm.consensus_step`` in an
experiment file, ``--consensus-step`` on a command line) without reading the message.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import consensus
from gossip.algorithms import ORDERS, fraction
from gossip.compression import build_compressor
from gossip.outer import check_outer_optimizer

__all__ = [
    "DENSE_COMPRESSORS",
    "SETTINGS",
    "SETTING_NAMES",
    "ConfigurationError",
    "Setting",
    "setting",
    "setting_fields",
    "settings_markdown",
]


class ConfigurationError(ValueError):
    """A setting that cannot work: ``field`` names it, ``reason`` says why.

    ``reason`` may refer to other fields as ``{name}`` for each name in ``mentions``;
    :meth:`render` writes every field (``field`` and the mentioned ones) the way a front end
    names it, e.g. as its flag. ``str(error)`` is ``"OWNER.FIELD: reason"`` (``"FIELD:
    reason"`` without an ``owner``), with mentioned fields written the same way.
    """

    def __init__(
        self, field: str, reason: str, *, mentions: tuple[str, ...] = (), owner: str = ""
    ) -> None:
        self.field = field
        self.reason = reason
        self.mentions = mentions
        self.owner = owner
        super().__init__(self.render(self._owned))

    def _owned(self, name: str) -> str:
        return f"{self.owner}.{name}" if self.owner else name

    def render(self, name_of: Callable[[str], str]) -> str:
        """``"NAME: reason"`` with ``field`` and each mentioned field written as
        ``name_of(field)``."""
        return f"{name_of(self.field)}: {self.reason_with(name_of)}"

    def reason_with(self, name_of: Callable[[str], str]) -> str:
        """``reason`` with each mentioned field written as ``name_of(field)``."""
        reason = self.reason
        for mentioned in self.mentions:
            reason = reason.replace("{" + mentioned + "}", name_of(mentioned))
        return reason


@dataclass(frozen=True)
class Setting:
    """One algorithm setting, declared once (see the module docstring for what derives
    from it).

    Attributes:
        name: the field name in every runner (``consensus_step``).
        type: ``int``, ``float`` or ``str``: what a command line converts its text to.
        default: the value an algorithm that reads it takes when it is left unset.
        allowed: the allowed values in words, for messages, help and docs (``(0, 1]``).
        help: what it does, one phrase.
        readers: the algorithms that read it; any other algorithm refuses it.
        check: ``check(value, algorithm)`` returns the value to keep or raises
            ``ValueError(reason)``.
        choices: the fixed set of values, where there is one (a command line offers them).
        defaults: per-algorithm defaults that differ from ``default``.
        fixed: algorithms that do not read it but always run with this value.
        metavar: what the command line shows for the value.
    """

    name: str
    type: type
    default: Any
    allowed: str
    help: str
    readers: tuple[str, ...]
    check: Callable[[Any, str], Any]
    choices: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    metavar: str | None = None

    @property
    def flag(self) -> str:
        """The command-line flag: ``--`` and the name with dashes (``--consensus-step``)."""
        return "--" + self.name.replace("_", "-")

    @property
    def convert(self) -> Callable[[str], Any]:
        """What a command line converts the flag's text with: :attr:`type`, or
        :func:`boolean` for a bool."""
        return boolean if self.type is bool else self.type

    def default_for(self, algorithm: str) -> Any:
        """The value ``algorithm`` takes when the setting is left unset."""
        return self.defaults.get(algorithm, self.default)

    def default_text(self) -> str:
        """The default in words, per-algorithm ones included (``1; local-sgd: 4``)."""
        text = f"{self.default}"
        for algorithm, value in self.defaults.items():
            text += f"; {algorithm}: {value}"
        return text


def boolean(text: str) -> bool:
    """A command line's ``true``/``false`` (``1``/``0``, ``yes``/``no``, ``on``/``off``, any
    case) as a bool; ``ValueError`` for anything else."""
    value = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False}
    value |= {"no": False, "off": False}
    if text.lower() not in value:
        raise ValueError(f"must be true or false, got {text!r}")
    return value[text.lower()]


DENSE_COMPRESSORS = ("none", "fp16", "bf16", "qsgd")
"""Codecs that send every coordinate: the only ones an algorithm that sends its model takes."""


def _order(value: Any, algorithm: str) -> str:
    if value not in ORDERS:
        raise ValueError(f"must be one of {', '.join(ORDERS)}; got {value!r}")
    return str(value)


_MINIMUM_LOCAL_STEPS = {"local-sgd": 2, "diloco": 1, "noloco": 1, "sparseloco": 1}

OUTER_FAMILY = ("diloco", "noloco", "sparseloco")
"""The algorithms with an outer optimizer over H inner steps (``gossip.outer``)."""

ANY_COMPRESSOR = ("choco", "sparseloco")
"""Algorithms that send differences a lossy codec may drop coordinates of: CHOCO (against
public copies) and SparseLoCo (whose error feedback keeps what was not sent)."""


def _local_steps(value: Any, algorithm: str) -> int:
    minimum = _MINIMUM_LOCAL_STEPS.get(algorithm, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        hint = " (local-sgd with 1 step is dpsgd with adapt-then-combine)" if minimum else ""
        raise ValueError(f"must be an integer >= {minimum} for {algorithm}{hint}; got {value!r}")
    return value


def _gossip_steps(value: Any, algorithm: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"must be an integer >= 1; got {value!r}")
    return value


def _aggregator(value: Any, algorithm: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a consensus spec string (e.g. 'mean'); got {value!r}")
    consensus.build(value)  # its ValueError names the spec
    return value


def _compressor(value: Any, algorithm: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a compressor spec string (e.g. 'fp16'); got {value!r}")
    codec = build_compressor(value).codec  # its ValueError names the spec
    if algorithm not in ANY_COMPRESSOR and codec not in DENSE_COMPRESSORS:
        raise ValueError(
            f"{codec} drops most coordinates of the model {algorithm} sends, and nothing "
            f"keeps them for later; use {', '.join(DENSE_COMPRESSORS)}, or choco or "
            "sparseloco, which keep what was not sent"
        )
    return value


def _outer_optimizer(value: Any, algorithm: str) -> str:
    # its ValueError names the bad part
    check_outer_optimizer(value, heavy_ball=algorithm == "noloco")
    return str(value)


def _error_feedback(value: Any, algorithm: str) -> float:
    return fraction(value, open_high=True)


def _consensus_step(value: Any, algorithm: str) -> float:
    return fraction(value, open_low=True)


def _boolean(value: Any, algorithm: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false; got {value!r}")
    return value


SETTINGS: tuple[Setting, ...] = (
    Setting(
        name="order",
        type=str,
        default="combine-then-adapt",
        allowed=", ".join(ORDERS),
        help="mix the neighbours' models before the local step (combine-then-adapt) or after",
        readers=("dpsgd", "push-sum"),
        check=_order,
        choices=ORDERS,
        defaults={"push-sum": "adapt-then-combine"},
        fixed={
            "local-sgd": "adapt-then-combine",
            "choco": "adapt-then-combine",
            "ad-psgd": "combine-then-adapt",
            "diloco": "adapt-then-combine",
            "noloco": "adapt-then-combine",
            "sparseloco": "adapt-then-combine",
        },
    ),
    Setting(
        name="local_steps",
        type=int,
        default=1,
        allowed="an integer >= 0 (local-sgd: >= 2; diloco, noloco, sparseloco, a peer: >= 1)",
        help="optimizer steps per exchange (the outer family's H: inner steps per outer step)",
        readers=("dpsgd", "local-sgd", "push-sum", "choco", *OUTER_FAMILY),
        check=_local_steps,
        defaults={"local-sgd": 4, "diloco": 50, "noloco": 50, "sparseloco": 50},
        fixed={"ad-psgd": 1},
        metavar="N",
    ),
    Setting(
        name="gossip_steps",
        type=int,
        default=1,
        allowed="an integer >= 1",
        help="gossip steps (exchanges, x <- W x each) after the local steps: Muffliato's "
        "noise once, then K gossip steps (docs/privacy.md)",
        readers=("dpsgd",),
        check=_gossip_steps,
        metavar="K",
    ),
    Setting(
        name="aggregator",
        type=str,
        default="mean",
        allowed="a consensus spec (mean, trimmed-mean:b=1, krum:f=1, ...; gossipnet consensus)",
        help="the rule that combines the vectors a node mixes (models; sparseloco: compressed "
        "pseudo-gradients); it must be able to run on the smallest neighbourhood (ad-psgd: "
        "the pair's 2 models)",
        readers=("dpsgd", "local-sgd", "ad-psgd", *OUTER_FAMILY),
        check=_aggregator,
        metavar="SPEC",
    ),
    Setting(
        name="compressor",
        type=str,
        default="none",
        allowed="none, fp16, bf16, qsgd[:bits=B]; choco and sparseloco: topk[:ratio=R], "
        "randk[:ratio=R], chunked-topk[:chunk=C,k=K,bits=B] too",
        help="compressor of what a node sends (its model; choco: differences; noloco: model "
        "and slow weights; sparseloco: its error-feedback buffer)",
        readers=("dpsgd", "local-sgd", "push-sum", "choco", "ad-psgd", *OUTER_FAMILY),
        check=_compressor,
        defaults={"sparseloco": "chunked-topk"},
        metavar="SPEC",
    ),
    Setting(
        name="consensus_step",
        type=float,
        default=0.5,
        allowed="(0, 1]",
        help="CHOCO's consensus step gamma; NoLoCo's pull gamma towards the pair's mean slow "
        "weights",
        readers=("choco", "noloco"),
        check=_consensus_step,
        defaults={"noloco": 0.7},
        metavar="GAMMA",
    ),
    Setting(
        name="outer_optimizer",
        type=str,
        default="sgd:lr=0.7,momentum=0.9,nesterov=true",
        allowed="sgd[:lr=,momentum=,nesterov=,weight_decay=], adam[:lr=,beta1=,beta2=,eps=,"
        "weight_decay=], adamw[...] (noloco: sgd with momentum, no nesterov)",
        help="the outer optimizer on the slow weights, stepped with the neighbourhood's "
        "pseudo-gradient (noloco: lr is beta, momentum mu; docs/algorithms.md)",
        readers=OUTER_FAMILY,
        check=_outer_optimizer,
        defaults={"noloco": "sgd:lr=0.7,momentum=0.5", "sparseloco": "sgd:lr=1"},
        metavar="SPEC",
    ),
    Setting(
        name="error_feedback",
        type=float,
        default=0.95,
        allowed="[0, 1)",
        help="SparseLoCo's decay beta of the error-feedback buffer (e <- beta e + Delta)",
        readers=("sparseloco",),
        check=_error_feedback,
        metavar="BETA",
    ),
    Setting(
        name="secure_sum",
        type=bool,
        default=False,
        allowed="true, false (needs aggregator mean, compressor none, >= 2 in-neighbours per "
        "node; a peer: --topology)",
        help="pairwise-masked neighbour sums: a receiver learns the weighted sum of its "
        "in-neighbours' models, not any single one (gossip.secure_sum, docs/privacy.md)",
        readers=("dpsgd", "local-sgd"),
        check=_boolean,
    ),
)
"""Every algorithm setting, in the order records, docs and help list them."""

SETTING_NAMES: tuple[str, ...] = tuple(item.name for item in SETTINGS)
"""The names of :data:`SETTINGS`."""

_BY_NAME = {item.name: item for item in SETTINGS}


def setting(name: str) -> Setting:
    """The :class:`Setting` called ``name`` (a ``KeyError`` for any other name)."""
    return _BY_NAME[name]


_Class = TypeVar("_Class", bound=type)


def setting_fields(cls: _Class) -> _Class:
    """Add one field per setting (``NAME: Any = None``) to ``cls``, applied before
    ``@dataclass``: a runner's configuration then takes every setting by its name, unset by
    default, without declaring them again. The class should declare
    ``def __getattr__(self, name: str) -> Any`` under ``TYPE_CHECKING`` so that type
    checkers accept the derived attributes."""
    annotations = dict(inspect.get_annotations(cls))
    for item in SETTINGS:
        if item.name in annotations:
            raise TypeError(f"{cls.__name__}.{item.name} is a setting; do not declare it")
        annotations[item.name] = "Any"
        setattr(cls, item.name, None)
    cls.__annotations__ = annotations
    return cls


def settings_markdown() -> str:
    """``docs/settings.md``: every setting, its flag, type, default, allowed values and
    readers, as :data:`SETTINGS` declares them."""
    lines = [
        "# Algorithm settings",
        "",
        "Generated from `gossip/settings.py` (`SETTINGS`) by "
        "`python -m gossip.settings_doc > docs/settings.md`; do not edit by hand.",
        "",
        "Each setting has the same name in an experiment file's `[algorithm]` table "
        "(`gossipnet sim`), in `PeerConfig` and `GossipConfig`, and a flag on "
        "`gossipnet peer` and `gossipnet launch`. A setting left unset takes the "
        "algorithm's default; a setting the algorithm does not read is an error, except "
        'that an algorithm which always runs with one value ("fixed by") accepts that value.',
        "",
        "| setting | flag | type | default | allowed | read by | fixed by | what it does |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for item in SETTINGS:
        fixed = ", ".join(f"{name}: {value}" for name, value in item.fixed.items()) or "-"
        lines.append(
            f"| `{item.name}` | `{item.flag}` | {item.type.__name__} | {item.default_text()} "
            f"| {item.allowed} | {', '.join(item.readers)} | {fixed} | {item.help} |"
        )
    return "\n".join(lines) + "\n"
