"""Passwords never leave the process: the one home of masking URLs and free text.

A storage URL (``postgresql+psycopg://user:secret@host/db``) or a tracking URI
(``https://user:secret@mlflow.example``) keeps working inside the harness, but everything
the harness shows or records goes through :func:`mask_url` or :func:`mask_text` first:
messages, log lines, MLflow params and tags (``harness.store.tracking.Tracker`` masks every value
it logs), the study's parent run, reports and ``harness study status``.
"""

from __future__ import annotations

import re

MASK = "***"

#: ``scheme://user:password@host`` (the password is everything up to the last '@' that is
#: followed by a host, so a password containing '@', ':' or a raw '/' (which SQLAlchemy
#: accepts) is masked whole; where the split is ambiguous more is masked, never less).
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)(?P<secret>[^\s]*)@"
                       r"(?=[^\s@/]*(?:[/?#\s]|$))")
#: ``?password=...``, ``&token=...`` and the like in query strings and free text.
_QUERY = re.compile(r"(?P<head>[?&;\s](?:password|passwd|pwd|token|secret|api_key|apikey|"
                    r"access_token|key)=)(?P<secret>[^&\s#]+)", re.IGNORECASE)


def mask_text(text: str) -> str:
    """``text`` with the password of every URL in it, and secret query values, replaced."""
    text = _USERINFO.sub(lambda m: m["head"] + MASK + "@", text)
    return _QUERY.sub(lambda m: m["head"] + MASK, text)


def mask_url(url: str) -> str:
    """A URL (storage or tracking) without its password, for messages, tags and params."""
    return mask_text(url)


def split_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """An HTTP(S) tracking URI without its ``user:password@`` part, and those two (None when
    absent). MLflow prints the URLs of runs it ends, and a study records its tracking URI: the
    harness gives MLflow the credentials through ``MLFLOW_TRACKING_USERNAME`` and
    ``MLFLOW_TRACKING_PASSWORD`` instead, MLflow's documented way."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    m = _USERINFO.match(uri)
    if m and m["head"].lower().startswith(("http://", "https://")):  # a raw '/' in the password
        user = m["head"].split("://", 1)[1][:-1]
        return (m["head"].split("://", 1)[0] + "://" + uri[m.end():], unquote(user) or None,
                unquote(m["secret"]) or None)
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return uri, None, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    return (urlunsplit(parts._replace(netloc=host)), unquote(user) or None,
            unquote(password) if password else None)
