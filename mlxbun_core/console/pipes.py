"""A verb whose reader went away (``mlxbun config show --json | head``) ends quietly."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TypeVar

SIGPIPE_STATUS = 141  # 128 + SIGPIPE: what a shell reports for `yes | head`'s writer

F = TypeVar("F", bound=Callable[..., int])


def quiet_on_closed_pipe(main: F) -> F:
    """Wrap a command's ``main``: a BrokenPipeError on stdout (the reader exited) ends it
    with status 141 and no traceback. stdout is pointed at /dev/null first, so the
    interpreter's own flush at exit cannot raise it again."""

    @functools.wraps(main)
    def run(*args: object, **kwargs: object) -> int:
        try:
            status = main(*args, **kwargs)
            sys.stdout.flush()  # inside the guard: a late write to a closed pipe fails here
            return status
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return SIGPIPE_STATUS

    return run  # type: ignore[return-value]  # the verb's own signature, wrapped
