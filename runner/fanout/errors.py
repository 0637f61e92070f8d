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
into these classes at the module that uses the library.
"""

from __future__ import annotations

import difflib
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
        where = f"{self.file}:{self.line}:{self.col}"
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


class JobLocked(FanoutError):
    exit_code = 6


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
