"""What every job shares: where its configuration came from, and the ``Job`` contract.

A job is a small frozen pydantic model: the validated :class:`Config` plus the few options of one
call, and a :meth:`Job.run` that does the work through the component functions and returns a
typed result. The CLI builds jobs from its flags, the Prefect flows from their (once-validated)
config, and the DVC stages call the CLI, so the three entry points run the same code.
"""

from __future__ import annotations

import abc
import logging
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from components.config import Config, load_config
from components.errors import UserError

log = logging.getLogger("components.jobs")

ROLLOUT_MAX_EPISODES = 256
"""All of a rollout's episodes (``--limit`` x ``--group-size``) are one batch: a typo such as
``--group-size 100000`` took all 24 GB of the machine. Here, not in rollout.py, so that the CLI's
parser can name it without importing the rollout job (torch)."""


class ConfigSource(BaseModel):
    """How a config was asked for: params file, profile and ``section.key=value`` overrides.

    Kept beside the validated :class:`Config` because a training launched as a subprocess (or on
    many ranks) must load the very same config in every process: :meth:`args` re-emits it as
    CLI flags.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: str | None = Field(None, description="params file (default params.yaml or $AGENT_GSPO_PARAMS)")
    profile: str | None = Field(None, description="profile in the params file (default: default)")
    overrides: tuple[str, ...] = Field((), description="section.key=value, applied last")

    def load(self) -> Config:
        """Validate once; raises :class:`components.config.ConfigError` (exit 2) naming the key."""
        return load_config(self.params, self.profile, list(self.overrides))

    def plus(self, overrides: list[str] | tuple[str, ...]) -> ConfigSource:
        """The same source with ``overrides`` applied *before* this source's own (those still win)."""
        return self.model_copy(update={"overrides": (*overrides, *self.overrides)})

    def args(self) -> list[str]:
        """``--params/--profile/--set`` flags that load this source in another process."""
        out: list[str] = []
        if self.params:
            out += ["--params", str(self.params)]
        if self.profile:
            out += ["--profile", str(self.profile)]
        for item in self.overrides:
            out += ["--set", item]
        return out


class JobOptionError(UserError):
    """A job built with an option outside its schema (e.g. a negative ``--budget-tokens``)."""


class Job(BaseModel, abc.ABC):
    """One pipeline step: ``Job(cfg=..., <options>).run() -> <typed result>``."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)
    KIND: ClassVar[str] = "job"

    cfg: Config = Field(description="the validated configuration (params.yaml + profile + overrides)")

    def __init__(self, **data: Any) -> None:
        """Options that fail the job's schema (a CLI flag, a flow parameter) are bad input: one
        :class:`JobOptionError` naming each option, not a pydantic traceback. A missing or unvalidated
        ``cfg`` (or an option no job has) stays a ValidationError: that is a caller's bug."""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            if any(not e["loc"] or e["loc"][0] == "cfg" or e["type"] == "extra_forbidden" for e in exc.errors()):
                raise  # a job built without a validated config is a caller's bug, not bad input
            bad = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<job>'}: {e['msg']}"
                            + (f" (got {e['input']!r})" if isinstance(e.get("input"), str | int | float) else "")
                            for e in exc.errors())
            raise JobOptionError(f"{type(self).KIND}: invalid option(s): {bad}") from exc

    @abc.abstractmethod
    def run(self) -> Any:
        """Do the work; bad input raises a :class:`components.errors.UserError` (exit 2)."""
