"""Secret values and their redaction from everything a sandbox sends back.

Which forms are caught (docs/secrets.md says the same, and the tests check each):

* the exact value;
* its base64 encoding, standard and URL-safe alphabets, with or without
  padding, alone or inside a longer base64 text (``Authorization: Basic
  base64(user:secret)``): every byte alignment is matched by its stable core
  (for secrets of 6 bytes or more; shorter ones only as a whole encoding);
* its percent-encoding (``quote``, ``quote_plus``; upper- or lower-case hex);
* its hex encoding (lower- or upper-case).

Redaction is a safety net against accidents (a token printed in a traceback,
echoed by a verbose tool), not a barrier: code that can read a secret can
always transform it in a way no filter recognises (reverse it, split it,
compress it).  Keep secrets out of sandboxes that should not have them.
"""

from __future__ import annotations

import base64
import re
import urllib.parse

REDACTED = "[REDACTED]"
#: Shortest base64 core matched inside longer base64 text; shorter cores
#: would match unrelated base64 by chance.
_MIN_CORE = 8


class Secret:
    """A value that must never appear in output, events, logs or ``repr``.

    It is injected into the sandbox as an environment value, or with
    ``as_file=True`` as a file: then the variable ``NAME_FILE`` holds the
    path of a file (mode 0400, in a private directory on the scratch tmpfs)
    that contains the value, and ``NAME`` itself is not set, so the value is
    not in any process's environment.  AgentNest redacts it to
    ``[REDACTED]`` in everything it returns, for the sandbox's whole life.

    .. versionchanged:: 0.4.0
       ``as_file``.
    """

    __slots__ = ("_value", "as_file")

    def __init__(self, value: str, *, as_file: bool = False) -> None:
        given: object = value  # callers may pass anything
        if not isinstance(given, str):
            from .errors import ConfigurationError

            raise ConfigurationError(f"Secret needs a str value, not {type(given).__name__}")
        # An empty value is accepted (0.3.0 did) and has nothing to redact.
        self._value = value
        self.as_file = bool(as_file)

    def get_secret_value(self) -> str:
        """The raw value (only for injecting it)."""
        return self._value

    @property
    def value(self) -> str:
        """The raw value: 0.3.0's name of :meth:`get_secret_value`."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********', as_file=True)" if self.as_file else "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and (other._value, other.as_file) == (self._value, self.as_file)

    def __hash__(self) -> int:
        return hash(("Secret", self._value, self.as_file))

    def __reduce__(self) -> tuple[object, ...]:
        # Pickling would copy the raw value somewhere we cannot redact.
        raise TypeError("Secret values cannot be pickled")


#: Where ``Secret(..., as_file=True)`` values are written in a sandbox.
SECRET_DIR = "/tmp/.agentnest-secrets"  # noqa: S105 - a directory, not a password


def secret_forms(value: str) -> tuple[str, ...]:
    """Every string that redaction replaces for the secret ``value``, longest first."""
    raw = value.encode("utf-8", "surrogatepass")
    found = {value, raw.hex(), raw.hex().upper()}
    for plus in (False, True):
        quoted = urllib.parse.quote_plus(value, safe="") if plus else urllib.parse.quote(value, safe="")
        found.add(quoted)
        found.add(re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quoted))
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(raw).decode("ascii")
        found.update((whole, whole.rstrip("=")))
        for shift, skip in ((0, 0), (1, 2), (2, 3)):
            # The characters of base64(prefix + value + suffix) that depend on
            # the value's bytes only, whatever comes before or after it.
            total = shift + len(raw)
            end = total // 3 * 4 + total % 3
            core = encode(b"\0" * shift + raw).decode("ascii")[skip:end]
            if len(core) >= _MIN_CORE:
                found.add(core)
    return tuple(sorted((f for f in found if f), key=len, reverse=True))


def expand(secrets: tuple[str, ...]) -> tuple[str, ...]:
    """The forms of all ``secrets`` (see :func:`secret_forms`), longest first."""
    forms: set[str] = set()
    for value in secrets:
        if value:
            forms.update(secret_forms(value))
    return tuple(sorted(forms, key=len, reverse=True))


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """Replace every occurrence of every string in ``secrets`` with ``[REDACTED]``.

    ``secrets`` are taken literally: pass :func:`expand` of the values to
    catch their encoded forms too.
    """
    for value in sorted(secrets, key=len, reverse=True):
        if value and value in text:
            text = text.replace(value, REDACTED)
    return text


class StreamRedactor:
    """Redacts secrets from a text stream delivered in chunks.

    A secret split across two chunks is still caught: the redactor holds back
    the longest tail of the text that could be the start of a secret, and
    releases it once the next chunk (or :meth:`flush`) shows what follows.
    """

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self._secrets = tuple(s for s in secrets if s)
        self._hold = max((len(s) for s in self._secrets), default=1) - 1
        self._pending = ""

    def feed(self, chunk: str) -> str:
        if not self._secrets:
            return chunk
        raw = self._pending + chunk
        cut = self._safe_cut(raw)
        self._pending = raw[cut:]
        return redact(raw[:cut], self._secrets)

    def _safe_cut(self, raw: str) -> int:
        """How much of ``raw`` can be released without splitting a secret.

        Hold back the longest tail that may still become a secret (a proper
        prefix of one, including a complete short secret that a longer one
        starts with), and never cut through an occurrence of a secret.
        """
        cut = len(raw)
        for i in range(max(0, len(raw) - self._hold), len(raw)):
            tail = raw[i:]
            if any(len(tail) < len(s) and s.startswith(tail) for s in self._secrets):
                cut = i
                break
        moved = True
        while moved:
            moved = False
            for secret in self._secrets:
                start = raw.find(secret, max(0, cut - len(secret) + 1))
                while start != -1 and start < cut:
                    if start + len(secret) > cut:
                        cut = start
                        moved = True
                        break
                    start = raw.find(secret, start + 1)
        return cut

    def flush(self) -> str:
        # What was held back may be a complete short secret waiting to see
        # whether a longer one continues: redact it on the way out.
        out, self._pending = redact(self._pending, self._secrets), ""
        return out
