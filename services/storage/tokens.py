"""Access tokens: create, list, revoke, and check one presented by a client.

A token reads `gpw_<token_id>_<secret>` (write: ingestion) or `gpr_<token_id>_<secret>` (read: the read API,
reports, /metrics, the dashboard). `token_id` (12 hex digits) is public: it names the token in `goodput token
list` and in logs. `secret` is 32 random bytes (urlsafe base64). The database keeps only
sha256(salt || secret) with a per-token random salt; a presented secret is hashed the same way and compared
with `hmac.compare_digest`. The secret has 256 bits of entropy, so a slow KDF would add nothing but latency to
every request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Connection, insert, select, update

from services.storage.tables import ApiToken

TokenKind = Literal["write", "read"]
PREFIXES = {"write": "gpw", "read": "gpr"}
KINDS = tuple(PREFIXES)
ALL_PROJECTS = "*"
PROJECT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_TOKEN_RE = re.compile(r"^(gpw|gpr)_([0-9a-f]{12})_([A-Za-z0-9_-]{20,128})$")


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenInfo:
    """A stored token, without its secret."""

    token_id: str
    kind: str
    project: str
    name: str | None
    created_at: float
    revoked_at: float | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredToken:
    info: TokenInfo
    salt: bytes
    secret_sha256: bytes


def hash_secret(salt: bytes, secret: str) -> bytes:
    return hashlib.sha256(salt + secret.encode("ascii")).digest()


def parse_token(token: str) -> tuple[TokenKind, str, str] | None:
    """(kind, token_id, secret) of a well-formed token, else None."""
    match = _TOKEN_RE.match(token)
    if match is None:
        return None
    kind: TokenKind = "write" if match.group(1) == "gpw" else "read"
    return kind, match.group(2), match.group(3)


def check_project(project: str, kind: str) -> None:
    if project == ALL_PROJECTS:
        if kind != "read":
            raise ValueError(f"project {ALL_PROJECTS!r} (every project) is for read tokens only; "
                             "a write token needs one project")
        return
    if not PROJECT_RE.match(project):
        raise ValueError(f"project must be 1-64 characters of letters, digits, '.', '_' or '-' (starting with a "
                         f"letter or digit), got {project!r}")


def create_token(conn: Connection, *, kind: str, project: str, name: str | None = None,
                 now: float | None = None) -> tuple[str, TokenInfo]:
    """Store a new token; returns (the token itself, shown only now; its info)."""
    if kind not in PREFIXES:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    check_project(project, kind)
    if name is not None and len(name) > 128:
        raise ValueError(f"name must be at most 128 characters, got {len(name)}")
    token_id = secrets.token_hex(6)
    secret = secrets.token_hex(24)  # hex: no '_' or '-', so a double-click selects the whole token
    salt = secrets.token_bytes(16)
    created = time.time() if now is None else now
    conn.execute(insert(ApiToken).values(
        token_id=token_id, kind=kind, project=project, name=name, salt=salt.hex(),
        secret_sha256=hash_secret(salt, secret).hex(), created_at=created, revoked_at=None))
    info = TokenInfo(token_id=token_id, kind=kind, project=project, name=name, created_at=created, revoked_at=None)
    return f"{PREFIXES[kind]}_{token_id}_{secret}", info


def list_tokens(conn: Connection) -> list[TokenInfo]:
    rows = conn.execute(select(ApiToken.token_id, ApiToken.kind, ApiToken.project, ApiToken.name,
                               ApiToken.created_at, ApiToken.revoked_at).order_by(ApiToken.created_at)).all()
    return [TokenInfo(token_id=r[0], kind=r[1], project=r[2], name=r[3], created_at=r[4], revoked_at=r[5])
            for r in rows]


def revoke_token(conn: Connection, token_id: str, *, now: float | None = None) -> bool:
    """Revoke a token by id (or by the whole token); False if no active token has that id."""
    parsed = parse_token(token_id)
    if parsed is not None:
        token_id = parsed[1]
    result = conn.execute(update(ApiToken).where(ApiToken.token_id == token_id, ApiToken.revoked_at.is_(None))
                          .values(revoked_at=time.time() if now is None else now))
    return bool(result.rowcount)


def has_active_tokens(conn: Connection) -> bool:
    return conn.execute(select(ApiToken.token_id).where(ApiToken.revoked_at.is_(None)).limit(1)).first() is not None


def find_token(conn: Connection, token_id: str) -> StoredToken | None:
    row = conn.execute(select(ApiToken.token_id, ApiToken.kind, ApiToken.project, ApiToken.name,
                              ApiToken.created_at, ApiToken.revoked_at, ApiToken.salt, ApiToken.secret_sha256)
                       .where(ApiToken.token_id == token_id)).first()
    if row is None:
        return None
    info = TokenInfo(token_id=row[0], kind=row[1], project=row[2], name=row[3], created_at=row[4],
                     revoked_at=row[5])
    return StoredToken(info=info, salt=bytes.fromhex(row[6]), secret_sha256=bytes.fromhex(row[7]))


def verify_secret(stored: StoredToken | None, secret: str) -> bool:
    """Constant-time comparison; an unknown token id still costs one hash and one comparison."""
    salt = stored.salt if stored is not None else b"\0" * 16
    expected = stored.secret_sha256 if stored is not None else b"\0" * 32
    return hmac.compare_digest(hash_secret(salt, secret), expected) and stored is not None
