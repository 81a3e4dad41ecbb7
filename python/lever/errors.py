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


class StoreError(LeverError):
    """A flash store that is missing, incomplete, or inconsistent with its manifest."""


class DramBudgetError(LeverError):
    """The DRAM budget is too small for the store (the message states the minimum)."""


class ReadLimitError(LeverError):
    """A read-bandwidth cap (`--read-limit`) that cannot be read."""


class ProfileError(LeverError):
    """A device profile that cannot be measured or used (see `lever profile`)."""


class FlashReadError(LeverError):
    """Reading a store's weights from flash failed.

    Raised by `lever.store.flash_reader.FlashReader` (from `wait()`, `read()`
    or the constructor). The message names the extent's label ("layer 7"),
    the file, the file offset of the failing chunk and the reason. Attributes
    set by the reader: `label`, `path`, `offset` (bytes, or None) and `reason`
    -- "io" (an errno), "short_read" (the file is truncated), "checksum",
    "timeout" (no read of the extent finished within the reader's deadline,
    seconds: `LEVER_IO_TIMEOUT_S`, default 30), "cancelled" (the reader was
    closed), "open" or "unavailable" (the requested backend cannot be used
    here).
    """


class ChecksumError(FlashReadError):
    """A chunk read from flash does not match its stored CRC32C."""


class UsageError(LeverError):
    """A command line that cannot be parsed: an unknown option, a missing or
    out-of-range value (the message names the option)."""


class PromptError(LeverError):
    """A prompt that cannot be used: unreadable, not UTF-8, too large or empty."""


class MemoryLimitError(DramBudgetError):
    """A `--memory-limit` below what the run needs (the message lists the
    minimum and its parts in MB; see `lever.memory.plan`)."""


class CgroupUnavailableError(LeverError):
    """A memory cgroup cannot be used here: not root, or no memory controller
    (the message says which; see `lever.memory.cgroup`)."""
