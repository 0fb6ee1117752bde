"""The errors posenc raises on purpose, to catch by class.

Every check of an argument, a shape, a dtype, a config dict or a stored file raises one of
these; anything else that escapes posenc (a plain ``ValueError`` from inside torch, a
``TypeError`` from ``None + 1``) is a bug, and the CLI reports it as one (exit 1) where these
exit 2 with their one-line message. Each class is also the built-in exception that Python's
conventions name for its case, so ``except ValueError`` (or ``TypeError``, ``KeyError``)
around posenc keeps working:

=====================  ==========================  ============================================
class                  also a                      raised for
=====================  ==========================  ============================================
``InvalidArgument``    ``ValueError``              a value out of range, an inconsistent shape,
                                                   dtype or device, an unknown name (the
                                                   message lists the known ones), a call a
                                                   backend cannot serve, a bad config value
``InvalidType``        ``InvalidArgument``,        an argument of the wrong type (a float or a
                       ``TypeError``               bool where a size is needed, a dict where a
                                                   config object is)
``MissingKey``         ``InvalidArgument``,        a required key missing from a config or
                       ``KeyError``                scaling dict (the message names it)
=====================  ==========================  ============================================

The lab adds two, both ``InvalidArgument``: ``posenc.lab.data.CorpusError`` (a missing,
unreadable or empty corpus) and ``posenc.lab.checkpoint.CheckpointMismatch`` (a corrupt run
record or checkpoint, or one made with other arguments or another posenc version).
"""

from __future__ import annotations

__all__ = ["PosencError", "InvalidArgument", "InvalidType", "MissingKey"]


class PosencError(Exception):
    """Base of every error posenc raises on purpose."""


class InvalidArgument(PosencError, ValueError):
    """A bad argument, shape, dtype, device, name, config value or stored file: the message
    names the argument and the allowed values."""


class InvalidType(InvalidArgument, TypeError):
    """An argument of the wrong type (a ``TypeError`` too)."""


class MissingKey(InvalidArgument, KeyError):
    """A required key missing from a dict (a ``KeyError`` too); the message names the key."""

    def __str__(self) -> str:
        # KeyError quotes its argument (repr); the message is a sentence, shown as written
        return str(self.args[0]) if self.args else ""
