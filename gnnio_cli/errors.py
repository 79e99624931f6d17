"""User-facing errors.

A :class:`GnnioError` carries one line that names the file, line, option or
argument at fault and, where it helps, what to do next. The CLI prints it
without a traceback (unless ``--verbose``) and exits with status 1.
"""


class GnnioError(ValueError):
    """An error caused by the user's input or environment, not a bug.

    A ValueError, as the errors PyG raises for the same mistakes are, so code
    written for PyG's layers (``except ValueError``) catches gnnio's too."""


class InputFormatError(GnnioError):
    """A malformed input file: the message names the file and line."""


class NativeUnavailable(GnnioError):
    """The native extension cannot be used; the message says why and what to do."""
