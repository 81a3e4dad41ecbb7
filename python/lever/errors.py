"""Errors that reach the user as one clear line (see `lever.cli.main`).

Everything the user can get wrong -- a model name, a missing package, a
corrupt file, a prompt that does not fit -- raises a subclass of `LeverError`
whose message alone says what happened and what to do.
"""


class LeverError(Exception):
    """Base class: the message is shown to the user as is, without a traceback."""


class UnknownModelError(LeverError):
    """A model name that is neither a registered model nor an existing path."""


class MissingPartError(LeverError):
    """A package holding (part of) a model's weights is not installed."""


class ModelFormatError(LeverError):
    """A model file is truncated, corrupt, or fails its checksum."""


class UnsupportedModelError(LeverError):
    """A well-formed model that Lever cannot run (architecture, tensor type, ...)."""


class ContextOverflowError(LeverError):
    """The prompt (plus requested tokens) does not fit the model's context."""
