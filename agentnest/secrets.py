"""Secret values and their redaction from everything a sandbox sends back."""

from __future__ import annotations

REDACTED = "[REDACTED]"


class Secret:
    """A value that must never appear in output, events, logs or ``repr``.

    It is injected into the sandbox as an environment value; AgentNest
    redacts it to ``[REDACTED]`` in everything it returns.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str) or not value:
            from .errors import ConfigurationError

            raise ConfigurationError("Secret needs a non-empty str value")
        self._value = value

    def get_secret_value(self) -> str:
        """The raw value (only for injecting it)."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> tuple[object, ...]:
        # Pickling would copy the raw value somewhere we cannot redact.
        raise TypeError("Secret values cannot be pickled")


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """Replace every occurrence of every secret with ``[REDACTED]``."""
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
