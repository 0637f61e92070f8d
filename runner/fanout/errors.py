"""fanout's exception tree, and the table of exit codes (``EXIT_CODES``) that the
classes take their codes from, ``fanout run --help`` lists and the docs' exit-code page
and man page are generated from.

    Exception
     └── FanoutError                 1   something went wrong (base, never raised bare)
          ├── JobError               2   the job file is invalid; carries every Problem found
          ├── UsageError             2   a command line fanout cannot follow (a --base revision
          │                              that is not there)
          ├── NothingSelected        3   the inputs selected no units
          ├── InputFailed            4   an input command failed or an input file is unreadable
          ├── EnvironmentProblem     4   the machine cannot run the job (no bwrap, no hosts)
          │    └── HostsUnavailable  4   every SSH host is down or quarantined
          ├── StateError             5   the state directory, a run or the journal is unusable
          ├── JobLocked              6   another run of the same job holds its lock
          ├── SpendStopped           7   money stopped the run (a budget, a spend cap)
          ├── Parked                 8   an agent's usage window resets too late to wait
          ├── PlanChanged           10   the job's plan is not the one reviewed (--expect-plan)
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

import errno
import os
import resource
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    """What fanout's exit status means (``EXIT_CODES`` says each in words)."""

    OK = 0
    FAILED = 1
    JOB_INVALID = 2
    NOTHING_SELECTED = 3
    CANNOT_RUN = 4
    STATE = 5
    LOCKED = 6
    SPEND_STOPPED = 7
    PARKED = 8
    QUARANTINED = 9
    PLAN_CHANGED = 10
    INTERNAL = 70
    INTERRUPTED = 130
    CONSOLE_CLOSED = 141


@dataclass(frozen=True, kw_only=True, slots=True)
class ExitMeaning:
    """One exit code in words: ``brief`` as ``fanout run --help`` says it after the
    number ("if some failed"), ``meaning`` as the exit-code page and the man page do
    (markdown code spans allowed).  ``run``: whether ``fanout run`` exits with it."""

    code: ExitCode
    brief: str
    meaning: str
    run: bool = True

    @property
    def name(self) -> str:
        return self.code.name.lower().replace("_", "-")


EXIT_CODES: tuple[ExitMeaning, ...] = (
    ExitMeaning(
        code=ExitCode.OK,
        brief="if every unit succeeded",
        meaning="success (every unit succeeded)",
    ),
    ExitMeaning(
        code=ExitCode.FAILED,
        brief="if some failed (listed in the report for a human)",
        meaning="some units failed (`fanout hosts trust`: the key was not trusted)",
    ),
    ExitMeaning(
        code=ExitCode.JOB_INVALID,
        brief="for an invalid job",
        meaning="invalid job file or command line; every problem is printed as"
        " `file:line:col: key.path: message`.  Met while a run selects (a duplicate unit"
        " id, a `units.id` that does not render, an id that spans lines, a record without"
        " an `id`), located in the job file (at `units.id` when that template made the"
        " id, else at the inline item) or at the record in its input"
        " (`data.jsonl:251: ...`); the run stops, resumable",
    ),
    ExitMeaning(
        code=ExitCode.NOTHING_SELECTED,
        brief="if nothing was selected",
        meaning="nothing selected (naming each `inputs.files` pattern that matched no file)",
    ),
    ExitMeaning(
        code=ExitCode.CANNOT_RUN,
        brief="if the inputs, the workers' commands or the hosts cannot run",
        meaning="the inputs or the machine cannot run the job (input command failed,"
        " sandbox missing, no host reachable); mid-run, the run stops, resumable",
    ),
    ExitMeaning(
        code=ExitCode.STATE,
        brief="for a state problem (a full disk under the state directory)",
        meaning="state problem (unknown run, unreadable journal; a full, read-only or"
        " failing disk under the state directory stops the run, resumable once fixed)",
    ),
    ExitMeaning(
        code=ExitCode.LOCKED,
        brief="if another run of the job holds its lock",
        meaning="another run of the same job holds its lock",
    ),
    ExitMeaning(
        code=ExitCode.SPEND_STOPPED,
        brief="if money stopped it (an [[apis]] budget spent, an API's or agent's spend cap)",
        meaning="money stopped the run: an API's `budget` for the run is spent, or the API"
        " refused for spend or credit (a spend cap, no credit, an exhausted quota);"
        " nothing new started, running attempts finished, and the run is resumable once"
        " there is more",
    ),
    ExitMeaning(
        code=ExitCode.PARKED,
        brief="if an agent's usage window resets later than a pause may last",
        meaning="an agent's usage window or daily quota resets later than"
        " `retry.throttle.max`: the run stopped, resumable, and says when it can go on;"
        " no unit was charged for it",
    ),
    ExitMeaning(
        code=ExitCode.QUARANTINED,
        brief="if no unit failed but units are quarantined (they need a person)",
        meaning="no unit failed, but units are quarantined: each failed the same way in"
        " `units.quarantineAfter` runs in a row, unchanged, and is not started until it"
        " changes or `fanout release` lets it; the report and `fanout status` list them"
        " under Needs a person",
    ),
    ExitMeaning(
        code=ExitCode.PLAN_CHANGED,
        brief="if --expect-plan names a plan other than the job's (nothing ran)",
        meaning="`fanout run --expect-plan HASH` refused before anything started: the job's"
        " plan hash (`fanout plan --hash`) is not the one reviewed, because the job file,"
        " a default of this fanout or the job's staged templates changed since",
    ),
    ExitMeaning(
        code=ExitCode.INTERNAL,
        brief="for an internal error",
        meaning="internal error (a bug in fanout): one line on stderr, the traceback"
        " appended to `${XDG_CACHE_HOME:-~/.cache}/fanout/fanout.log`; please report it",
    ),
    ExitMeaning(
        code=ExitCode.INTERRUPTED,
        brief="if interrupted",
        meaning="interrupted (Ctrl-C, SIGTERM), or `run`'s console closed (the run is"
        " stopped, resumable)",
    ),
    ExitMeaning(
        code=ExitCode.CONSOLE_CLOSED,
        brief="if its console closed",
        meaning="another command's console closed under it (`fanout status | head`):"
        " nothing more is said (128 + SIGPIPE, as a shell tool killed by SIGPIPE reports)",
        run=False,
    ),
)


def run_exits() -> str:
    """The sentence of ``fanout run --help`` that lists its exit codes:
    ``Exit 0 if every unit succeeded, 1 if some failed ..., 130 if interrupted.``"""
    said = [f"{int(row.code)} {row.brief}" for row in EXIT_CODES if row.run]
    return "Exit " + ", ".join(said) + "."


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
INTERNAL_ERROR_EXIT = ExitCode.INTERNAL


class FanoutError(Exception):
    """Base of every error fanout raises on purpose; the CLI prints it without a traceback."""

    exit_code: ExitCode = ExitCode.FAILED
    # What to do next, printed on a line of its own under the message (set by the run
    # an error stopped: how to continue it).
    hint = ""

    def __str__(self) -> str:
        message = super().__str__()
        return f"{message}\n{self.hint}" if self.hint else message


class JobError(FanoutError):
    """The job file is invalid.  ``problems`` holds every problem found, in file order."""

    exit_code = ExitCode.JOB_INVALID

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.col, p.key))
        super().__init__("\n".join(str(p) for p in self.problems))


class UsageError(FanoutError):
    """A command line fanout cannot follow, said with what to do instead."""

    exit_code = ExitCode.JOB_INVALID


class NothingSelected(FanoutError):
    exit_code = ExitCode.NOTHING_SELECTED


class InputFailed(FanoutError):
    exit_code = ExitCode.CANNOT_RUN


class EnvironmentProblem(FanoutError):
    exit_code = ExitCode.CANNOT_RUN


class HostsUnavailable(EnvironmentProblem):
    pass


class StateError(FanoutError):
    exit_code = ExitCode.STATE


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
    exit_code = ExitCode.LOCKED


class SpendStopped(FanoutError):
    """Money stopped the run: the run's budget for an API is spent, or the API itself
    refused for spend or credit (a spend cap, no credit, an exhausted quota).  Nothing
    new starts; the run is resumable once there is more (a larger ``budget``, credit)."""

    exit_code = ExitCode.SPEND_STOPPED


class Parked(FanoutError):
    """An agent's usage window or daily quota resets later than a pause may last
    (``retry.throttle.max``): the run stops, resumable, and says when it can go on.
    No unit is charged for it.  ``resume_at`` (epoch seconds, None if the agent did not
    say) is when the window resets: ``fanout schedule`` continues the run then."""

    exit_code = ExitCode.PARKED

    def __init__(self, message: str, *, resume_at: float | None = None) -> None:
        super().__init__(message)
        self.resume_at = resume_at


class PlanChanged(FanoutError):
    """``fanout run --expect-plan HASH``: the job's plan is not the one reviewed."""

    exit_code = ExitCode.PLAN_CHANGED


class Interrupted(FanoutError):
    exit_code = ExitCode.INTERRUPTED


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """The choice ``word`` was most likely meant to be, ignoring case, '_' and '-'."""
    options = list(choices)

    def fold(text: str) -> str:
        return text.lower().replace("_", "").replace("-", "")

    for option in options:
        if fold(option) == fold(word):
            return option
    import difflib  # only when something is misspelt

    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return close[0] if close else None
