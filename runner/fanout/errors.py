"""fanout's exception tree and the exit code each failure maps to.

    Exception
     └── FanoutError                 1   something went wrong (base, never raised bare)
          ├── JobError               2   the job file is invalid; carries every Problem found
          ├── NothingSelected        3   the inputs selected no units
          ├── InputFailed            4   an input command failed or an input file is unreadable
          ├── EnvironmentProblem     4   the machine cannot run the job (no bwrap, no hosts)
          │    └── HostsUnavailable  4   every SSH host is down or quarantined
          ├── StateError             5   the state directory, a run or the journal is unusable
          ├── JobLocked              6   another run of the same job holds its lock
          └── Interrupted          130   the run was interrupted (Ctrl-C, SIGTERM) and drained

     anything else               70   a bug in fanout (EX_SOFTWARE): the CLI prints one line,
                                      "fanout: internal error: ...", and appends the traceback
                                      to ${XDG_CACHE_HOME:-~/.cache}/fanout/fanout.log

A unit's failure is never an exception: it is an ``Outcome`` value (see ``outcome``),
so one failing unit cannot cancel its siblings.  Third-party exceptions are translated
into these classes at the module that uses the library.  Any FanoutError raised while a
run is going (by the selection, the journal or the fleet) stops that run resumably: no
new unit starts, running attempts finish and settle, the run is recorded as stopped
and the next ``fanout run`` continues it; ``hint`` then says so under the message.
"""

from __future__ import annotations

import difflib
import errno
import os
import resource
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One located problem in a job file, rendered as ``file:line:col: key.path: message``."""

    file: str
    line: int
    col: int
    key: str
    message: str

    def __str__(self) -> str:
        # A problem in the data (a record of an input file) has a line but no column.
        where = (
            self.file
            + (f":{self.line}" if self.line else "")
            + (f":{self.col}" if self.col else "")
        )
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "col": self.col,
            "key": self.key,
            "message": self.message,
        }


# The exit code of an exception that is not a FanoutError: sysexits.h's EX_SOFTWARE.
INTERNAL_ERROR_EXIT = 70


class FanoutError(Exception):
    """Base of every error fanout raises on purpose; the CLI prints it without a traceback."""

    exit_code = 1
    # What to do next, printed on a line of its own under the message (set by the run
    # an error stopped: how to continue it).
    hint = ""

    def __str__(self) -> str:
        message = super().__str__()
        return f"{message}\n{self.hint}" if self.hint else message


class JobError(FanoutError):
    """The job file is invalid.  ``problems`` holds every problem found, in file order."""

    exit_code = 2

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.col, p.key))
        super().__init__("\n".join(str(p) for p in self.problems))


class NothingSelected(FanoutError):
    exit_code = 3


class InputFailed(FanoutError):
    exit_code = 4


class EnvironmentProblem(FanoutError):
    exit_code = 4


class HostsUnavailable(EnvironmentProblem):
    pass


class StateError(FanoutError):
    exit_code = 5


def storage_error(directory: object, reason: str) -> StateError:
    """fanout could not write under its state directory (a full disk, a read-only or
    failing device, or no file descriptor left to open a file with): never a unit's
    fault, and ``fanout run`` continues once fixed."""
    if reason in _OUT_OF_FILES:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return StateError(
            f"{reason}: {directory}; fanout's limit on open files (`ulimit -n`) is {soft}:"
            " raise it or lower runtime.maxConcurrentTasks, and `fanout run` continues"
        )
    return StateError(f"{reason}: {directory}; free space and `fanout run` continues")


# OSError numbers that mean the machine's storage refused fanout (not a bug, not a unit).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
# And those that mean fanout had no file descriptor left (its own limit, the system's).
FILES_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})


def _lowered(text: str) -> str:
    return text[:1].lower() + text[1:]


# How a reason reads for those (``strerror`` lowered, as fanout words every OSError).
_OUT_OF_FILES = frozenset(_lowered(os.strerror(number)) for number in FILES_ERRNOS)


def storage_problem(exc: BaseException) -> StateError | None:
    """The StateError for an OSError of fanout's own storage (a full disk anywhere fanout
    writes, no file descriptor left), or None for any other exception."""
    if not isinstance(exc, OSError) or exc.errno not in STORAGE_ERRNOS | FILES_ERRNOS:
        return None
    return storage_error(exc.filename or "?", _lowered(exc.strerror or str(exc)))


class JobLocked(FanoutError):
    exit_code = 6


class SpendStopped(FanoutError):
    """Money stopped the run: the run's budget for an API is spent, or the API itself
    refused for spend or credit (a spend cap, no credit, an exhausted quota).  Nothing
    new starts; the run is resumable once there is more (a larger ``budget``, credit)."""

    exit_code = 7


class Parked(FanoutError):
    """An agent's usage window or daily quota resets later than a pause may last
    (``retry.throttle.max``): the run stops, resumable, and says when it can go on.
    No unit is charged for it.  ``resume_at`` (epoch seconds, None if the agent did not
    say) is when the window resets: ``fanout schedule`` continues the run then."""

    exit_code = 8

    def __init__(self, message: str, *, resume_at: float | None = None) -> None:
        super().__init__(message)
        self.resume_at = resume_at


class Interrupted(FanoutError):
    exit_code = 130


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """The choice ``word`` was most likely meant to be, ignoring case, '_' and '-'."""
    options = list(choices)

    def fold(text: str) -> str:
        return text.lower().replace("_", "").replace("-", "")

    for option in options:
        if fold(option) == fold(word):
            return option
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return close[0] if close else None
