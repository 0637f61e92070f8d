"""What a render may spend: the Budget of time and size every render runs under, the
checks made before a step that could make far more than it is given, and running a
unit's renders off the event loop.

A template is the job's, but what it loops over, pads and repeats is often a unit's
(its records, ``last.outputTail``), and a loop in a prompt once ran for 11 s on the
event loop, the gateway frozen with it.  Python cannot stop a thread from outside, so
a deadline around a render would leave it running; the render is bounded from inside
instead.  The sandbox (``rendering``) takes a ``step`` of the active Budget at every
iteration of a loop and every call, filter, test, attribute, operator and write, and
charges the Budget the size of what each returns and writes:

- time: a look at the thread's CPU clock, about every quarter of a millisecond of it,
  ends a render past ``SECONDS`` (CPU time, so a loaded machine does not fail a render
  that waited); a long render gives the GIL up every half millisecond, so the event
  loop never waits long for it;
- size: ``SIZE`` characters or items in all, counted as strings, lists, tuples, dicts
  and sets are returned and text is written (a lazy ``range`` or generator is counted
  as it is used, one step an item);
- one step: a step that can make far more than it is given (padding, repetition,
  replacement, filling, wrapping, ``lipsum``, ``'%'`` and ``format`` widths) is
  checked before it runs against ``ITEMS`` (the bound ``'*'`` has always had), and a
  join or concatenation against what the Budget has left, so no single step makes
  gigabytes before a look could stop it.

Every template of one attempt of a unit shares one Budget (``invocation.render``);
any other render (a unit id, ``plan``, compiling's constant folding) gets its own.
An overrun is an ``Overrun``, which the sandbox turns into a RenderError: a per-unit
``template:`` failure, or a located problem for ``plan``.  These are the only copies
of the bounds; docs/guides/backlog.md ("Templates") states them.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import itertools
import json
import pprint
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

from jinja2 import filters
from jinja2.exceptions import SecurityError
from jinja2.utils import generate_lorem_ipsum, pass_environment, pass_eval_context

# CPU seconds one unit's templates may render for (all of one attempt's together).
SECONDS = 2.0
# Characters or items one render may make (what it returns and writes, see above).
SIZE = 1 << 24
# What one step may make by padding or repeating, and the bits of one '**'.  (A range
# has Jinja's own bound, 100,000 items.)
ITEMS = 1 << 20
BITS = 1 << 20
# How often a render looks at its clock (a look is a system call, under a microsecond):
# about every quarter of a millisecond of CPU time, however long its steps take (``x in
# list`` is one step however long the list), so the steps between looks are counted
# anew at each.
_LOOK_INTERVAL_S = 0.00025
_MOST_STEPS_BETWEEN_LOOKS = 10_000
# How often a long render gives the GIL up (a sleep(0): 30 us of CPU, 100 us in all,
# measured; os.sched_yield's bare release is taken back before the loop's thread wakes,
# p99 23 ms with four renders).  Without it the loop waited the interpreter's 5 ms
# switch interval for each turn, longer with several renders (bench/templates.py, four
# at once: p50 23 ms, p99 135 ms); with it p50 3 ms, p99 17 ms.  A render shorter than
# the interval (a prompt: ~0.1 ms) never pays for it.
_YIELD_INTERVAL_S = 0.0005

T = TypeVar("T")


class Overrun(SecurityError):
    """A render past its Budget, or a step refused before it could make too much."""


class Budget:
    """The time and size one render may spend, and a way to stop it from another
    thread.  One thread spends it: its clock is that thread's CPU time."""

    __slots__ = (
        "_countdown",
        "_deadline",
        "_every",
        "_left",
        "_looked",
        "_over",
        "_stopped",
        "_yielded",
        "seconds",
        "size",
    )

    def __init__(self, *, seconds: float = SECONDS, size: int = SIZE) -> None:
        self.seconds = seconds
        self.size = size
        self._left = size
        self._every = self._countdown = 100
        self._looked = self._yielded = 0.0
        self._deadline: float | None = None
        self._stopped = False
        self._over: str | None = None

    def start(self) -> None:
        """Start the clock, in the thread that renders (once)."""
        if self._deadline is None:
            self._looked = self._yielded = time.thread_time()
            self._deadline = self._looked + self.seconds

    def stop(self) -> None:
        """End the render at its next step (a cancel, from the event loop's thread)."""
        self._stopped = True
        self._countdown = 0

    def step(self, made: int = 0) -> None:
        """One step of the render, which made ``made`` characters or items."""
        self._left -= made
        self._countdown -= 1
        if self._countdown <= 0 or self._left < 0:
            self._look()

    def afford(self, count: int) -> None:
        """Refuse a step that would make ``count`` more than is left, before it runs."""
        if count > self._left:
            self._overrun(self._size_message())

    def _size_message(self) -> str:
        return f"rendering makes more than {self.size:,} characters or items"

    def _look(self) -> None:
        if self._over is not None:
            self._overrun(self._over)
        if self._left < 0:
            self._overrun(self._size_message())
        if self._stopped:
            self._overrun("rendering was stopped")
        now = time.thread_time()
        if self._deadline is not None and now > self._deadline:
            self._overrun(
                f"rendering took more than {self.seconds:g} s of CPU time (a loop too long?)"
            )
        spent, self._looked = now - self._looked, now
        steps = self._every * _LOOK_INTERVAL_S / spent if spent > 0 else self._every * 2
        self._every = self._countdown = max(1, min(_MOST_STEPS_BETWEEN_LOOKS, int(steps)))
        if now - self._yielded >= _YIELD_INTERVAL_S:  # a short render never pays for it
            time.sleep(0)
            self._yielded = time.thread_time()

    def _overrun(self, message: str) -> None:
        # Every later step fails too: a template cannot catch the error and go on.
        self._over = message
        self._countdown = 0
        raise Overrun(message)


_active: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "fanout_template_budget", default=None
)


# The Budget templates rendered now spend, if any (the ContextVar's own method: the
# sandbox asks at every step).
active: Callable[[], Budget | None] = _active.get


@contextlib.contextmanager
def bounded(budget: Budget | None = None) -> Iterator[Budget]:
    """Templates rendered inside spend ``budget``; without one, the active Budget (an
    attempt's templates share it), else a new one."""
    current = _active.get()
    if budget is None and current is not None:
        yield current
        return
    budget = budget if budget is not None else Budget()
    budget.start()
    token = _active.set(budget)
    try:
        yield budget
    finally:
        _active.reset(token)


async def render_off_loop(work: Callable[[], T], budget: Budget | None = None) -> T:
    """``work()`` in a worker thread, every template it renders under one Budget (a
    new one unless given): a slow render never stalls the event loop (the gateway, the
    display, a signal), and a cancel stops the render at its next step, then waits for
    the thread."""
    import asyncio  # here: `fanout validate` and `plan` never render off a loop

    budget = budget if budget is not None else Budget()

    def spend() -> T:
        with bounded(budget):
            return work()

    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, contextvars.copy_context().run, spend)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        budget.stop()
        await asyncio.wait([future])
        if not future.cancelled():
            future.exception()  # retrieved: the cancel is what this raises
        raise


_SIZED = (str, bytes, list, tuple, dict, set, frozenset)


def size_of(value: Any) -> int:
    """What ``value`` counts against a Budget: its length if it is made of characters
    or items (a lazy range or generator counts as it is used)."""
    return len(value) if isinstance(value, _SIZED) else 0


def afford(count: int) -> None:
    """``Budget.afford`` of the active Budget; outside a render, against ``SIZE``."""
    budget = _active.get()
    if budget is not None:
        budget.afford(count)
    elif count > SIZE:
        raise Overrun(f"rendering makes more than {SIZE:,} characters or items")


def at_most(count: int, what: str, unit: str = "characters") -> None:
    """Refuse one step that would make more than ``ITEMS`` (``what`` says what)."""
    if count > ITEMS:
        raise Overrun(f"{what} more than a million {unit}")


def _int(value: Any) -> int:
    """``value`` if it is an int (a wrong type is the filter's own error to raise)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _text_length(value: Any) -> int:
    return len(value) if isinstance(value, str) else len(str(value))


# --- checks of one step, before it runs -------------------------------------------------


def check_pad(name: str, width: Any) -> None:
    at_most(_int(width), f"{name!r} would pad a value to")


def check_replace(name: str, text: Any, old: Any, new: Any, count: Any = None) -> None:
    if not (isinstance(text, str | bytes) and type(old) is type(text) is type(new)):
        return
    found = len(text) + 1 if not old else cast(Any, text).count(old)
    if _int(count) >= 0 and count is not None:  # None or a negative count: every one
        found = min(found, _int(count))
    at_most(found * (len(new) - len(old)), f"{name!r} would add")


def check_expandtabs(text: Any, tabsize: Any = 8) -> None:
    if isinstance(text, str | bytes):
        tab = "\t" if isinstance(text, str) else b"\t"
        at_most(cast(Any, text).count(tab) * _int(tabsize), "'expandtabs' would add")


def check_translate(text: Any, table: Any) -> None:
    if isinstance(text, str) and isinstance(table, dict):
        longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1)
        at_most(len(text) * (longest - 1), "'translate' would add")


def check_join(separator: Any, items: list[Any]) -> None:
    joints = _text_length(separator) * max(len(items) - 1, 0)
    afford(joints + sum(_text_length(item) for item in items))


_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(?:[a-zA-Z%]|$)")


def check_percent(name: str, template: Any) -> None:
    """A ``%`` format's widths and precisions (``'%999999999d'``), summed."""
    if not isinstance(template, str):
        return
    total = 0
    for match in _PERCENT.finditer(template):
        for number in match.groups():
            if number == "*":
                raise Overrun(f"{name!r} with a '*' width is refused (write the width)")
            if number:
                total += ITEMS + 1 if len(number) > 7 else int(number)
    at_most(total, f"{name!r} would pad to")


def check_format(template: str) -> None:
    """A ``str.format`` string's widths and precisions (``'{:>999999999}'``), summed."""
    total = 0
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError:
        return  # malformed: ``format`` itself says so
    for _, _, spec, _ in fields:
        if not spec:
            continue
        if "{" in spec:
            raise Overrun("'format' with a field inside a field's format is refused")
        for number in re.findall(r"\d+", spec):
            total += ITEMS + 1 if len(number) > 7 else int(number)
    at_most(total, "'format' would pad to")


def check_method(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Check a call of a method of a string, bytes or container that can make far more
    than it is given; returns ``args`` (an iterable ``join`` is given as a list)."""
    owner = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    if isinstance(owner, str | bytes):
        first = args[0] if args else None
        if name in ("center", "ljust", "rjust", "zfill"):
            check_pad(name, kwargs.get("width", first))
        elif name == "replace" and len(args) >= 2:
            check_replace(name, owner, args[0], args[1], args[2] if len(args) > 2 else None)
        elif name == "expandtabs":
            check_expandtabs(owner, kwargs.get("tabsize", first if args else 8))
        elif name == "translate" and args:
            check_translate(owner, first)
        elif name == "join" and len(args) == 1 and not kwargs:
            items = list(first) if first is not None else []
            check_join(owner, items)
            return (items,)
    elif isinstance(owner, list | dict | set) and name in ("extend", "update") and args:
        afford(sum(size_of(arg) for arg in args))
    return args


# --- filters and globals whose one step could be huge ----------------------------------


def _check_indent(value: Any, width: Any = 4, *_: Any, **__: Any) -> None:
    lines = str(value).count("\n") + 1
    at_most(lines * (len(width) if isinstance(width, str) else _int(width)), "'indent' would add")


def _check_wordwrap(
    value: Any, width: Any = 79, break_long_words: Any = True, wrapstring: Any = None, *_: Any
) -> None:
    text = str(value)
    at_most(len(text), "'wordwrap' would wrap")
    columns = max(_int(width), 1)
    lines = len(text) // columns + text.count("\n") + 1
    at_most(
        lines * len(wrapstring if isinstance(wrapstring, str) else "\n"), "'wordwrap' would add"
    )
    if break_long_words:
        # textwrap cuts a long word a piece at a time, copying the rest each time.
        copies = sum(len(word) ** 2 for word in text.split() if len(word) > columns)
        if copies // columns > _WRAP_COPIES:
            longest = max(map(len, text.split()))
            raise Overrun(
                f"'wordwrap' would cut words of up to {longest:,} characters into pieces of"
                f" {columns}, which takes too long"
            )


# What textwrap may copy cutting long words (about a second's worth).
_WRAP_COPIES = 1 << 36


def _check_urlize(
    value: Any,
    trim_url_limit: Any = None,
    nofollow: Any = False,
    target: Any = None,
    rel: Any = None,
    *_: Any,
) -> None:
    attributes = len(str(target or "")) + len(str(rel or ""))
    at_most(len(str(value).split()) * attributes, "'urlize' would add")


def _check_batch(value: Any, linecount: Any, fill_with: Any = None, *_: Any) -> None:
    if fill_with is not None:
        at_most(_int(linecount), "'batch' would fill a list to", "items")


def _check_slice(value: Any, slices: Any, *_: Any) -> None:
    at_most(_int(slices), "'slice' would make", "lists")


# Checked before the filter runs, with the filter's own arguments (after the one Jinja
# passes); a check that cannot read them leaves the filter to raise its own error.
FILTER_CHECKS: dict[str, Callable[..., None]] = {
    "center": lambda value, width=80, *_: check_pad("center", width),
    "indent": _check_indent,
    "wordwrap": _check_wordwrap,
    "replace": lambda value, old, new, count=None, *_: check_replace(
        "replace", str(value), old, new, count
    ),
    "format": lambda value, *_, **__: check_percent("format", value),
    "urlize": _check_urlize,
    "batch": _check_batch,
    "slice": _check_slice,
}


@pass_eval_context
def join(
    eval_ctx: Any, value: Iterable[Any], d: str = "", attribute: str | int | None = None
) -> str:
    """Jinja's ``join``, its size checked before it runs."""
    items = list(value)
    if attribute is not None:
        getter = filters.make_attrgetter(eval_ctx.environment, attribute)
        items = [getter(item) for item in items]
    check_join(d, items)
    return str(filters.sync_do_join(eval_ctx, items, d))


@pass_environment
def sum_(
    environment: Any, iterable: Iterable[Any], attribute: str | int | None = None, start: Any = 0
) -> Any:
    """Jinja's ``sum``; lists (or tuples) summed in one pass, as Python's ``sum`` would
    take time quadratic in their number."""
    if not isinstance(start, list | tuple):
        return filters.sync_do_sum(environment, iterable, attribute, start)
    items = list(iterable)
    if attribute is not None:
        getter = filters.make_attrgetter(environment, attribute)
        items = [getter(item) for item in items]
    if not all(type(item) is type(start) for item in items):
        return sum(items, start)  # Python's own TypeError
    afford(len(start) + sum(len(item) for item in items))
    return type(start)(itertools.chain(start, *items))


def tojson(value: Any, indent: int | str | None = None) -> str:
    """Plain JSON (Jinja's escapes <, > and & for HTML); indented, it is written a
    piece at a time against the Budget, since indentation grows with depth."""
    if indent is None:
        return json.dumps(value, ensure_ascii=False, default=str)
    encoder = json.JSONEncoder(indent=indent, ensure_ascii=False, default=str)
    return "".join(_charged(encoder.iterencode(value)))


def pprint_(value: Any) -> str:
    """Jinja's ``pprint`` (Python's ``pformat``), written against the Budget."""
    stream = _ChargedText()
    pprint.PrettyPrinter(stream=stream).pprint(value)
    return stream.getvalue()[:-1]  # pprint ends with a newline, pformat does not


class _ChargedText(io.StringIO):
    """A stream for ``pprint``, afforded by the Budget as it is written."""

    def write(self, text: str) -> int:
        afford(self.tell() + len(text))
        return super().write(text)


def _charged(pieces: Iterable[str]) -> Iterator[str]:
    """``pieces``, each one afforded by the Budget as it comes (outside a render, all
    of them together against ``SIZE``)."""
    made = 0
    for piece in pieces:
        made += len(piece)
        afford(made)
        yield piece


def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """Jinja's ``lipsum``, refused when its paragraphs could pass ``ITEMS`` characters
    (eight a word, a little over what its words average)."""
    at_most(_int(n) * _int(max) * 8, "'lipsum' would write")
    return str(generate_lorem_ipsum(n=n, html=html, min=min, max=max))
