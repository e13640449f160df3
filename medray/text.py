"""The one text normaliser used by every loader (and by metrics in robust mode)."""

from __future__ import annotations

import re
import unicodedata

# Romanian has two encodings of the same letters: legacy cedilla (ş ţ) and the correct
# comma-below (ș ț). Mixed corpora must compare equal, so the loaders unify to comma-below.
CEDILLA_TO_COMMA = str.maketrans({"ş": "ș", "ţ": "ț", "Ş": "Ș", "Ţ": "Ț"})

_WHITESPACE = re.compile(r"\s+")

COMPAT_MODES = (None, "medqaro")


def normalize(text: str, compat: str | None = None) -> str:
    """NFC, cedilla -> comma-below, line breaks -> space, collapsed whitespace.

    ``compat="medqaro"`` reproduces the reference preprocessing
    ``str(x).strip().replace('\\n', '').replace('\\r', '')``, which glues the words on both
    sides of a line break together; use it only to reproduce the paper's numbers exactly.
    """
    if compat not in COMPAT_MODES:
        raise ValueError(f"unknown compat mode {compat!r}; expected one of {COMPAT_MODES}")
    text = unicodedata.normalize("NFC", str(text))
    if compat == "medqaro":
        return text.strip().replace("\n", "").replace("\r", "")
    text = text.translate(CEDILLA_TO_COMMA)
    return _WHITESPACE.sub(" ", text).strip()
