"""Signed evidence: the gate trusts an evaluation record or a decision only when its maker held the key.

The gate (:mod:`components.tracking.gate`) checks that a per-item record was not changed after its
run logged it. That cannot tell who made the run: with ordinary ``MlflowClient`` calls anyone who
can write to the tracking server can create a run holding a crafted ``items.jsonl`` and its sha256
as a param. So what the gate relies on is signed by the evaluator with a secret key, and verified:

* an evaluation run of a registry version holds the param ``eval.signature``, over
  :meth:`EvaluationClaim.payload`: the run's own id, the registered model's name and version, the
  setting key, ``eval.items_sha256`` and ``eval.main_system``;
* a decision-log run holds the param ``signature``, over its own id and :data:`DECISION_FIELDS`
  (model, version, decision, setting, the evaluation runs, the items' sha256, outcome and rule).

A signature is ``v1:<key id>:<HMAC-SHA256 hex>`` over a canonical payload (kind and format version,
then the fields as JSON with sorted keys). The run id is in the payload, so a signature copied onto
another run does not verify; params are immutable in MLflow, so a signed run's claims cannot be
edited afterwards. The key id (an HMAC of a constant under the key) only names the key in messages.

Why ``hmac`` from the standard library rather than a signing library: MLflow has no run signing (a
run proves nothing about who created it beyond the server's own authentication), and the evaluator
and the gate are this project holding one shared secret, for which a MAC is the standard tool;
public-key signatures (``cryptography``, not a dependency) would add a key pair to manage and
protect nothing more here, since whoever may evaluate may also promote.

The key (:func:`load_key`): ``$AGENT_GSPO_SIGNING_KEY``; else the file ``registry.signing.key_file``;
else a key generated once, mode 0600, by the first evaluation of a registry version: beside a
``sqlite:///`` registry's database (``<db>.signing-key``), or ``~/.config/agent-gspo/signing-key``
for a server. A team shares one key through the variable or a file from its secret store. The key
is never logged, printed, or stored in MLflow; messages name its source and key id only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from components.config_sections import SigningConfig
from components.errors import UserError
from components.tracking.errors import PromotionError
from components.tracking.registry import sqlite_path

log = logging.getLogger(__name__)
KEY_ENV = "AGENT_GSPO_SIGNING_KEY"
EVAL_SIGNATURE_PARAM = "eval.signature"
"""evaluation-run param holding the signature of its :class:`EvaluationClaim`"""
DECISION_SIGNATURE_PARAM = "signature"
"""decision-log-run param holding the signature of :data:`DECISION_FIELDS`"""
FORMAT = "v1"
MIN_KEY_CHARS = 32
KEY_FILE_SUFFIX = ".signing-key"
DECISION_FIELDS = ("model", "version", "decision", "setting", "compared_to", "eval_run_id", "items_sha256",
                   "champion_eval_run_id", "outcome", "rule.test", "rule.confidence", "rule.margin",
                   "rule.token_factor", "rule.max_token_ratio", "rule.min_items", "rule.min_accuracy")
"""the decision-log params a signature covers (other params may be added to a run later: not covered)"""
_SIGNATURE_RE = re.compile(rf"^{FORMAT}:(?P<kid>[0-9a-f]{{12}}):(?P<mac>[0-9a-f]{{64}})$")


class UntrustedRecord(PromotionError):
    """An evaluation record whose signature is missing or does not verify under the configured key."""


@dataclass(frozen=True)
class SigningKey:
    """The secret (never shown: not in ``repr``) and where it came from (for messages)."""

    secret: bytes = field(repr=False)
    source: str

    @property
    def key_id(self) -> str:
        """12 hex digits naming the key in messages (an HMAC under the key: it reveals nothing of it)."""
        return hmac.new(self.secret, b"agent-gspo signing key id", hashlib.sha256).hexdigest()[:12]


@dataclass(frozen=True)
class Trust:
    """What the gate accepts: records signed under ``key``; unsigned ones only when ``accept_unsigned``.

    ``missing`` says why ``key`` is None (where it was looked for). The default trusts nothing."""

    key: SigningKey | None = None
    accept_unsigned: bool = False
    missing: str = "no signing key was given"


def _canonical(kind: str, fields: Mapping[str, str]) -> bytes:
    body = json.dumps(dict(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return f"agent-gspo/{kind}/{FORMAT}\n{body}".encode()


@dataclass(frozen=True)
class EvaluationClaim:
    """What an evaluation run of a registry version states, as the gate reads it from its params."""

    run_id: str
    registered_version: str
    """``models:/<name>/<version>`` (param ``eval.registered_version``)"""
    setting: str
    items_sha256: str
    main_system: str

    def payload(self) -> bytes:
        name, _, version = self.registered_version.removeprefix("models:/").rpartition("/")
        return _canonical("evaluation", {"run_id": self.run_id, "model": name, "version": version,
                                         "setting": self.setting, "items_sha256": self.items_sha256,
                                         "main_system": self.main_system})


def decision_payload(run_id: str, params: Mapping[str, str]) -> bytes:
    """The signed payload of a decision-log run: its id and its :data:`DECISION_FIELDS` params."""
    return _canonical("decision", {"run_id": run_id} | {f: str(params.get(f, "")) for f in DECISION_FIELDS})


def sign(key: SigningKey, payload: bytes) -> str:
    """``v1:<key id>:<HMAC-SHA256 of payload under the key>``."""
    return f"{FORMAT}:{key.key_id}:{hmac.new(key.secret, payload, hashlib.sha256).hexdigest()}"


def signature_problem(trust: Trust, payload: bytes, signature: str | None, what: str) -> str | None:
    """Why ``signature`` does not make ``payload`` trusted (one phrase starting ``unsigned`` or
    ``signature does not match``), or None when it does. An unsigned ``what`` accepted under
    ``accept_unsigned`` is a warning naming it."""
    if not signature:
        if trust.accept_unsigned:
            log.warning("warning: %s is unsigned; accepted because registry.signing.accept_unsigned is true", what)
            return None
        return ("unsigned: nothing shows that an evaluator holding the signing key made it (fabricated, or "
                "made before records were signed)")
    match = _SIGNATURE_RE.match(signature)
    if match is None:
        return f"signature does not match: not of the form {FORMAT}:<key id>:<hmac>"
    if trust.key is None:
        return f"signature does not match: signed under key {match['kid']}, but {trust.missing}"
    if hmac.compare_digest(signature, sign(trust.key, payload)):
        return None
    if match["kid"] != trust.key.key_id:
        return (f"signature does not match: signed under key {match['kid']}, the key here ({trust.key.source}) is "
                f"{trust.key.key_id}; every machine that evaluates or promotes needs the same key")
    return "signature does not match: the run's params differ from what was signed (a copied or forged signature)"


def default_key_path(uri: str) -> Path:
    """Where the key is generated when none is configured: beside a sqlite registry's database,
    else ``$XDG_CONFIG_HOME/agent-gspo/signing-key`` (``~/.config`` when unset)."""
    db = sqlite_path(uri)
    if db is not None:
        return db.resolve().with_name(db.name + KEY_FILE_SUFFIX)
    home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(home) / "agent-gspo" / "signing-key"


def _checked(text: str, source: str) -> SigningKey:
    secret = text.strip()
    if len(secret) < MIN_KEY_CHARS:
        raise UserError(f"signing key from {source} has {len(secret)} characters; it needs at least "
                        f"{MIN_KEY_CHARS} (e.g. python -c 'import secrets; print(secrets.token_hex(32))')")
    return SigningKey(secret.encode(), source)


def _read(path: Path, source: str) -> SigningKey:
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"signing key {source}: cannot be read ({type(exc).__name__}: "
                        f"{getattr(exc, 'strerror', None) or 'not UTF-8 text'})") from None
    if mode & 0o077:
        log.warning("warning: signing key file %s can be read by other users (mode %o): chmod 600 it", path,
                    mode & 0o777)
    return _checked(text, source)


def _write_new(path: Path, text: str) -> None:
    """Create ``path`` (mode 0600; FileExistsError when it exists) holding ``text``, synced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())


def _generate(path: Path) -> None:
    """Write a new random key to ``path`` (mode 0600) unless another process got there first."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    _write_new(tmp, secrets.token_hex(32) + "\n")
    try:
        os.link(tmp, path)  # atomic, and never replaces a key another process wrote meanwhile
    except FileExistsError:
        return
    except OSError:  # a file system without hard links: exclusive create (a reader may race the write)
        try:
            _write_new(path, tmp.read_text())
        except FileExistsError:
            return
    finally:
        tmp.unlink(missing_ok=True)
    log.info("signing key: generated %s (mode 0600); evaluation records of this registry are signed with it "
             "(share it, or set $%s / registry.signing.key_file, where another machine evaluates or promotes)",
             path, KEY_ENV)


def load_key(settings: SigningConfig, uri: str, *, create: bool) -> SigningKey | None:
    """The signing key (module docstring): ``$AGENT_GSPO_SIGNING_KEY``, ``settings.key_file``, or the
    default file of registry ``uri``, generated when ``create`` (None when it does not exist)."""
    env = os.environ.get(KEY_ENV, "")
    if env.strip():
        return _checked(env, f"${KEY_ENV}")
    if settings.key_file:
        path = Path(settings.key_file).expanduser()
        return _read(path, f"registry.signing.key_file {path}")
    path = default_key_path(uri)
    if not path.is_file():
        if not create:
            return None
        _generate(path)
    return _read(path, str(path))


def trust_for(settings: SigningConfig, uri: str) -> Trust:
    """What the gate of registry ``uri`` accepts under ``settings`` (never generates a key)."""
    missing = (f"no signing key is configured here (${KEY_ENV} and registry.signing.key_file are unset and "
               f"{default_key_path(uri)} does not exist): give this machine the evaluator's key")
    return Trust(load_key(settings, uri, create=False), settings.accept_unsigned, missing)
