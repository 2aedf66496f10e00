"""Model-registry helpers: versions, aliases, and the promotion lock.

What the gate reads and writes (evaluation results and their verified per-item records) is in
:mod:`components.tracking.gate`.

Locking (:func:`promotion_lock`): MLflow has no conditional write, so two promotions at once
could both read the same champion and both move ``@champion``. Two mechanisms:

* ``file`` (automatic for ``sqlite:///`` registries): an OS file lock (``filelock``) beside the
  database file. Guarantee: mutual exclusion between all threads and processes on hosts that
  share that file system (flock; not reliable on some NFS setups).
* ``tag`` (automatic for HTTP / Postgres backends, where clients share nothing but the
  registry): a lease stored as the registered-model tag :data:`LOCK_TAG` =
  ``<token> <expiry-epoch>``. Acquire = read the tag; if absent/expired write our token; wait
  :data:`SETTLE_S`; re-read and own the lock only if the tag still holds our token (the last
  writer wins, everyone else sees a foreign token and backs off). Guarantee: mutual exclusion
  as long as each client's read->write gap is shorter than ``SETTLE_S`` (one REST round trip vs
  0.5 s). The holder re-checks the lease right before writing (:meth:`LockHandle.verify`)
  and aborts without writing if it expired (default ``ttl_s`` 300 s, so a slow
  ``champion_metrics_fn`` cannot silently outlive it); a crashed holder blocks others for at
  most ``ttl_s``. This is a lease, not consensus: a client paused for
  longer than ``SETTLE_S`` between its read and write can break it. For strict guarantees use
  a database advisory lock in front of the registry.
"""

from __future__ import annotations

import contextlib
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from components.io import file_lock
from components.tracking.errors import PromotionError

LOCK_TAG = "promotion.lock"
SETTLE_S = 0.5
LockKind = Literal["auto", "file", "tag", "none"]


def get_version(client: MlflowClient, name: str, version: str | int) -> ModelVersion:
    """The model version, or :class:`PromotionError` naming it when it does not exist."""
    try:
        return client.get_model_version(name, str(version))
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise PromotionError(f"model {name!r} version {version} does not exist") from None
        raise


def alias_version(client: MlflowClient, name: str, alias: str) -> ModelVersion | None:
    """The version behind ``name@alias``, or None when the alias is not set."""
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def _registry_uri(client: MlflowClient) -> str:
    return str(getattr(client, "_registry_uri", None) or client.tracking_uri)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; None for an in-memory or non-sqlite registry."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def _promotion_running(path: Path, timeout_s: float) -> PromotionError:
    return PromotionError(f"promotion lock {path} still held after {timeout_s:.0f} s (another promotion running?)")


def _read_lease(client: MlflowClient, name: str) -> tuple[str | None, float]:
    raw = client.get_registered_model(name).tags.get(LOCK_TAG)
    if not raw:
        return None, 0.0
    token, _, expiry = raw.partition(" ")
    try:
        return token, float(expiry)
    except ValueError:
        return None, 0.0


@dataclass
class LockHandle:
    """What :func:`promotion_lock` yields; call :meth:`verify` right before writing."""

    kind: LockKind
    verify: Callable[[], None] = field(default=lambda: None)
    """Raise :class:`PromotionError` if the lock was lost (tag lease expired and taken over)."""


@contextlib.contextmanager
def _tag_lease(client: MlflowClient, name: str, timeout_s: float, ttl_s: float) -> Iterator[LockHandle]:
    token = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    while True:
        holder, expiry = _read_lease(client, name)
        if holder is None or expiry < time.time():
            try:
                client.set_registered_model_tag(name, LOCK_TAG, f"{token} {time.time() + ttl_s:.3f}")
            except MlflowException:  # a concurrent insert of the same tag key collided: contention
                pass
            else:
                time.sleep(SETTLE_S)
                if _read_lease(client, name)[0] == token:
                    break
        if time.monotonic() > deadline:
            raise PromotionError(f"registry lock tag {LOCK_TAG!r} on model {name!r} still held after "
                                 f"{timeout_s:.0f} s (held by {holder}); it expires at {expiry:.0f}")
        time.sleep(0.1 + random.random() * 0.3)

    def verify() -> None:
        holder, expiry = _read_lease(client, name)
        if holder != token or expiry < time.time():
            raise PromotionError(f"registry lock on model {name!r} was lost (lease of {ttl_s:.0f} s expired "
                                 f"or taken over); nothing was written, re-run the promotion")

    try:
        yield LockHandle("tag", verify)
    finally:
        with contextlib.suppress(MlflowException):
            if _read_lease(client, name)[0] == token:
                client.delete_registered_model_tag(name, LOCK_TAG)


def lock_kind_for(client: MlflowClient, kind: LockKind = "auto") -> LockKind:
    """Resolve ``auto``: a file lock for a file-based sqlite registry, the tag lease otherwise."""
    if kind != "auto":
        return kind
    return "file" if sqlite_path(_registry_uri(client)) is not None else "tag"


@contextlib.contextmanager
def promotion_lock(client: MlflowClient, name: str, *, kind: LockKind = "auto", timeout_s: float = 60.0,
                   ttl_s: float = 300.0) -> Iterator[LockHandle]:
    """Serialise promotions of ``name`` (see the module docstring for guarantees)."""
    resolved = lock_kind_for(client, kind)
    if resolved == "file":
        db = sqlite_path(_registry_uri(client))
        if db is None:
            raise PromotionError(f"file lock needs a sqlite:/// registry, got {_registry_uri(client)}")
        db.parent.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^\w.\-]", "_", name)
        with file_lock(db.with_name(f"{db.name}.{safe}.promotion.lock"), timeout_s, busy=_promotion_running):
            yield LockHandle("file")
    elif resolved == "tag":
        with _tag_lease(client, name, timeout_s, ttl_s) as handle:
            yield handle
    else:
        yield LockHandle("none")
