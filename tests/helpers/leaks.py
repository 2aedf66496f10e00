"""A planted secret must appear in no output, stored value or file (the pipeline's URI passwords, the
gate's signing key)."""

from __future__ import annotations

from pathlib import Path


def assert_secrets_absent(secrets: list[str], *texts: str, folders: tuple[Path, ...] = ()) -> None:
    """No planted secret in the given texts, nor in any file under ``folders``."""
    blobs = list(texts)
    for folder in folders:
        blobs += [p.read_bytes().decode(errors="replace") for p in folder.rglob("*") if p.is_file()]
    for secret in secrets:
        leaks = [b[max(0, b.find(secret) - 200):b.find(secret) + 50] for b in blobs if secret in b]
        assert not leaks, f"planted secret {secret!r} leaked: {leaks[:2]}"
