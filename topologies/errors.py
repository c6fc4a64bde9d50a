"""Exceptions raised for bad topology input; each names the parameter and what is allowed."""

from __future__ import annotations


class TopologyError(ValueError):
    """A topology was asked for with a parameter it cannot take.

    ``parameter`` names the offending argument (``"n"``, ``"degree"``, ``"p"``, ``"name"`` ...)
    so that a command-line front end can translate it into its flag (``--nodes``, ``--degree``).
    """

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.message = message


class MixingMatrixError(ValueError):
    """A mixing matrix broke a property it was asked to have (the message names the row/column)."""
