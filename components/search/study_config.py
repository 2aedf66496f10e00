"""A study remembers the config its trials ran under; a worker with another config is refused.

Why: a study's trials are only comparable if they ran under the same settings. Rejoining a study
after changing, say, ``search.max_tokens_per_episode`` used to mix the old trials in (their
constraint computed against the old limit) and report a "feasible" best that broke the new one.

The first worker records on the study (Optuna study user attrs, so every host sees it):

* ``search:config_hash`` -- :meth:`Config.hash` of :func:`outcome_config` (the config with the
  settings that cannot change a trial's outcome reset);
* ``search:config`` -- that config flattened (``section.key``, URI passwords redacted), only to
  name the differing settings in the refusal.

Left out (they steer the search's own bookkeeping or where results go, not what a trial yields):
``search.trials``, ``budget_tokens``, ``budget_seconds``, ``storage``, ``study_name``,
``out_params`` and ``enabled``; the ``tracking`` section (already outside :meth:`Config.hash`)
and the profile's *name* (its settings are in the hash).

A study made before hashes were recorded and already holding trials cannot be checked: it is
adopted with a warning. Two workers with different configs joining a fresh study at the same
instant may both find nothing recorded; each reads the record back after writing it, and
:func:`changed` lets a worker that lost that race stop before its next trial. A trial it had already
started then completes under its config, so every admitted trial also carries the hash it ran under
(``search:config_hash``, a trial attribute) and the best is chosen among the trials of the recorded
config only (:func:`own_trials`).
"""

from __future__ import annotations

import sys
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from components.config import Config, SearchConfig
from components.search import budget as B
from components.search.errors import SearchError
from components.search.storage import redact

STUDY_CONFIG_HASH = "search:config_hash"
STUDY_CONFIG = "search:config"
BOOKKEEPING = ("enabled", "trials", "budget_tokens", "budget_seconds", "storage", "study_name", "out_params")
"""``search.*`` settings that do not change a trial's outcome (reset before hashing)."""
_SHOWN = 5
"""differing settings named in the refusal (then a count)"""


class ConfigMismatchError(SearchError):
    """The study was created under another config: its trials are not comparable with this one's."""


def outcome_config(cfg: Config) -> Config:
    """``cfg`` with the settings that cannot change a trial's outcome reset to their defaults."""
    search = cfg.search.model_copy(update={k: SearchConfig.model_fields[k].default for k in BOOKKEEPING})
    return cfg.model_copy(update={"search": search, "profile": Config.model_fields["profile"].default})


def config_hash(cfg: Config) -> str:
    """The hash a study records: :meth:`Config.hash` of :func:`outcome_config` (``tracking`` excluded there)."""
    return outcome_config(cfg).hash()


def config_view(cfg: Config) -> dict[str, Any]:
    """The hashed settings flattened (``section.key`` -> value, passwords redacted), for naming differences."""
    skip = {f"search.{k}" for k in BOOKKEEPING} | {"profile"}
    return {k: v for k, v in outcome_config(cfg).flat().items() if not k.startswith("tracking.") and k not in skip}


def mismatch_error(name: str, url: str | optuna.storages.BaseStorage, recorded: str, mine: str,
                   recorded_view: Any, my_view: dict[str, Any]) -> ConfigMismatchError:
    """The one-line refusal: study, storage (password redacted), differing settings and how to go on."""
    if isinstance(recorded_view, dict):
        keys = sorted(k for k in set(recorded_view) | set(my_view) if recorded_view.get(k) != my_view.get(k))
        shown = [f"{k}: {recorded_view.get(k, '<unset>')} in the study, {my_view.get(k, '<unset>')} now"
                 for k in keys[:_SHOWN]]
        more = f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else ""
        differing = f"differing: {'; '.join(shown)}{more}; " if keys else ""
    else:
        differing = ""
    return ConfigMismatchError(
        f"search: study {name!r} in {redact(url)} was run under another config ({differing}config hash "
        f"{recorded[:12]} in the study, {mine[:12]} now): its trials are not comparable with this config's. "
        f"Start a new study (--set search.study_name=NEW_NAME; worker: --study-name) or use another --storage, "
        f"or rerun with the study's settings")


def check_study_config(study: optuna.Study, cfg: Config, url: str | optuna.storages.BaseStorage,
                       name: str) -> str:
    """Record ``cfg``'s hash on a study that has none; raise :class:`ConfigMismatchError` if the
    study's is another. Returns the hash, for :func:`changed`."""
    mine, view = config_hash(cfg), config_view(cfg)
    recorded = study.user_attrs.get(STUDY_CONFIG_HASH)
    if recorded is None:
        earlier = [t for t in study.get_trials(deepcopy=False) if not B.is_refused(t)]
        study.set_user_attr(STUDY_CONFIG, view)  # before the hash: whoever sees a hash finds its settings
        study.set_user_attr(STUDY_CONFIG_HASH, mine)
        if earlier:
            print(f"search: study {name!r} in {redact(url)} has {len(earlier)} trial(s) but no recorded config "
                  f"(made by an older version): they cannot be checked against this config; recorded it",
                  file=sys.stderr)
        recorded = study.user_attrs.get(STUDY_CONFIG_HASH)  # read back: a racing worker may have written last
    if recorded != mine:
        raise mismatch_error(name, url, str(recorded), mine, study.user_attrs.get(STUDY_CONFIG), view)
    return mine


def changed(study: optuna.Study, mine: str, cfg: Config, url: str | optuna.storages.BaseStorage,
            name: str) -> ConfigMismatchError | None:
    """The refusal if the study's recorded config is no longer ``mine`` (a racing worker wrote last)."""
    recorded = study.user_attrs.get(STUDY_CONFIG_HASH)
    if recorded == mine:
        return None
    return mismatch_error(name, url, str(recorded), mine, study.user_attrs.get(STUDY_CONFIG), config_view(cfg))


def own_trials(study: optuna.Study, trials: list[FrozenTrial], name: str) -> list[FrozenTrial]:
    """``trials`` of the study's recorded config; trials without a hash (older versions) count as its own.

    A trial that ran under another config (a worker that lost the race above) is left out, with one
    warning, so that its result cannot become the best of a config it did not run under."""
    recorded = study.user_attrs.get(STUDY_CONFIG_HASH)
    if recorded is None:
        return trials
    own = [t for t in trials if t.user_attrs.get(B.ATTR_CONFIG_HASH, recorded) == recorded]
    if len(own) < len(trials):
        foreign = [t.number for t in trials if t not in own]
        print(f"search: study {name!r}: trial(s) {', '.join(map(str, foreign))} ran under another config (a worker "
              f"with other settings joined at the same instant): left out of the best", file=sys.stderr)
    return own
