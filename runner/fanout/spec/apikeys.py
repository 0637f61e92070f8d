"""The real keys of a job's ``[[apis]]``, read from the coordinator's environment for
the gateway alone: never for a worker, nor for any other process fanout starts."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import EnvironmentProblem
from ..isolation.exposure import Handed
from . import Spec


def api_keys(spec: Spec, environ: Mapping[str, str]) -> dict[str, str]:
    """API name -> its real key, for each API with a ``keySecret``; EnvironmentProblem
    naming every variable that is not set, as ``Runner.secrets`` does for task.secrets
    (checked before the run is recorded, so nothing starts that could not authenticate).

    An API without ``keySecret`` is absent: the gateway sends it no key."""
    named = [api.key_secret for api in spec.apis if api.key_secret is not None]
    # Two APIs may share one key (two endpoints of one account): named once.
    missing = list(dict.fromkeys(name for name in named if name not in environ))
    if missing:
        raise EnvironmentProblem(
            f"API key(s) {', '.join(missing)} not set: export them in the environment "
            "fanout runs in ([[apis]] keySecret names them)"
        )
    return {api.name: environ[api.key_secret] for api in spec.apis if api.key_secret is not None}


def without_keys(spec: Spec, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less the variables that hold ``spec``'s [[apis]] keys and its
    notify webhook's URL: what a command fanout starts with its own environment gets
    (the input command).  Decision: the key is the gateway's alone, and the URL the
    notifier's; a command that needs one of its own reads another variable
    (``task.secrets`` may not name a keySecret either)."""
    named = {api.key_secret for api in spec.apis}
    if spec.notify is not None and spec.notify.webhook_secret is not None:
        named.add(spec.notify.webhook_secret)
    return {name: value for name, value in environ.items() if name not in named}


def secret_names(spec: Spec) -> tuple[str, ...]:
    """Every variable of the coordinator's environment that holds one of ``spec``'s
    secrets: its [[apis]] keys, its ``task.secrets``, and what ``[notify]`` names (the
    webhook's URL, the command's secrets), each once."""
    keys = (api.key_secret for api in spec.apis if api.key_secret is not None)
    notify: list[str] = []
    if spec.notify is not None:
        notify += [spec.notify.webhook_secret] if spec.notify.webhook_secret else []
        notify += spec.notify.secrets
    return tuple(dict.fromkeys([*keys, *spec.task.secrets, *notify]))


def handed(spec: Spec) -> Handed:
    """What ``spec`` hands each worker that the other units must not read (``exposure``):
    nothing once it accepts plain directories (``runtime.unsandboxedSecrets``)."""
    if spec.runtime.unsandboxed_secrets:
        return Handed()
    return Handed(tokens=bool(spec.apis), secrets=bool(spec.task.secrets))
