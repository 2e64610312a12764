"""A member's URL with its credentials masked, for every output of the library (labels, errors,
logs, status, metrics), whether or not the URL parses.

Credentials are read the way a person wrote them, not the way ``urlsplit`` parses them: a
password with an unescaped ``/``, ``?`` or ``#`` ends ``urlsplit``'s netloc early, so its
"password" would be a piece of the real one and the rest would be printed as a path, query or
fragment. Here the user information is everything between ``://`` and the *last* ``@`` (a ``@``
elsewhere must be written ``%40``: ``urls.check_url`` says so). Query options whose name
says they are secret (``password``, ``ssl_password``, ``sentinel_password``, any ``*token*``,
``*secret*``) are masked too, their value running to the next ``&name=`` (an unescaped ``&`` or
``#`` inside it stays masked).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, unquote_plus

MASK = "***"

#: Where a URL's scheme ends (``redis://``, ``redis+sentinel://``...).
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: Words in a query option's name that make its value a secret.
_SECRET_WORDS = ("pass", "secret", "token")
#: Characters that end the user information early for ``urlsplit`` and redis-py.
RESERVED_IN_CREDENTIALS = "/?#"


def split_credentials(url: str) -> tuple[str, str, str | None, str]:
    """``url`` as (scheme and ``://``, user, password or None, what follows the ``@``). No
    ``@``: user and password are empty/None and the rest is everything after the scheme."""
    scheme = _SCHEME.match(url)
    head = scheme.group(0) if scheme else ""
    rest = url[len(head) :]
    userinfo, at, after = rest.rpartition("@")
    if not at:
        return head, "", None, rest
    user, colon, password = userinfo.partition(":")
    return head, user, password if colon else None, after


def mask_url(url: str) -> str:
    """``url`` with its password and its secret query options replaced by ``***``."""
    head, user, password, rest = split_credentials(url)
    userinfo = ""
    if password is not None:
        userinfo = f"{user}:{MASK}@"
    elif "@" in url[len(head) :]:
        # A user with no password: Redis has no such login, so it is most likely a password
        # written without its ":" (redis://secret@host).
        userinfo = f"{MASK}@" if user else "@"
    return head + userinfo + _mask_query(rest)


def _mask_query(rest: str) -> str:
    """``rest`` (what follows the user information) with the values of its secret options
    masked; the query starts at the first ``?`` and is not cut at a ``#``."""
    base, sep, query = rest.partition("?")
    if not sep:
        return rest
    shown: list[str] = []
    in_secret = False
    for segment in query.split("&"):
        name, equals, _value = segment.partition("=")
        if equals:  # (a segment without one: the rest of a value that held an unescaped &)
            in_secret = is_secret_option(name)
            shown.append(f"{name}={MASK}" if in_secret else segment)
        elif not in_secret:
            shown.append(segment)
        # else: a piece of a secret value (it held an unescaped "&"): not shown
    return base + sep + "&".join(shown)


def is_secret_option(name: str) -> bool:
    """Whether the option ``name`` (as written: percent-encoded or not) holds a secret."""
    lowered = unquote_plus(name).lower()
    return any(word in lowered for word in _SECRET_WORDS)


def secrets_of(url: str) -> list[str]:
    """The credential texts in ``url`` (its password, its secret options' values), longest
    first: what must not appear in any text shown about it (see ``scrub``)."""
    _head, user, password, rest = split_credentials(url)
    found = [password] if password else [user] if user and "@" in url else []
    _base, _sep, query = rest.partition("?")
    value: list[str] | None = None
    for segment in query.split("&") if query else []:
        name, equals, text = segment.partition("=")
        if equals:
            if value:
                found.append("&".join(value))
            value = [text] if is_secret_option(name) else None
        elif value is not None:
            value.append(segment)
    if value:
        found.append("&".join(value))
    found += [decode(s) for s in found for decode in (unquote, unquote_plus)]
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """``text`` (an error's message about ``url``) with every credential of ``url`` in it
    replaced by ``***``."""
    for secret in secrets_of(url):
        text = text.replace(secret, MASK)
    return text
