"""The one exception type for bad user input, shared by every hwnas package.

It lives in ``supernet`` because every other package already depends on it. The CLI
turns a :class:`UserError` into a single ``hwnas: error: ...`` line and a non-zero exit,
without a traceback; anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: say what is wrong and what was expected.

    Examples:
        >>> import hwnas
        >>> from hwnas.supernet import get_space
        >>> try:
        ...     get_space("no-such-space")
        ... except hwnas.UserError as error:
        ...     print("hwnas: error:", str(error).split(";")[0])
        hwnas: error: unknown space 'no-such-space'
    """


class WriteError(UserError, OSError):
    """A file or directory could not be written (full disk, read-only filesystem, no
    permission): one line naming the path and what the system said. It is also an
    :class:`OSError` (``errno``, ``filename``), so code that handles those keeps working."""

    def __init__(self, errno: int | None, strerror: str, filename: str | None = None,
                 message: str | None = None) -> None:
        super().__init__(errno, strerror, filename)
        self.message = message or f"cannot write {filename}: {strerror}"

    def __str__(self) -> str:
        return self.message
