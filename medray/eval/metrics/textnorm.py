"""Answer normalisation and tokenisation for the two metric modes.

``medqaro`` reproduces the reference evaluation code character for character:

    def normalize_text(text):
        text = text.lower()
        text = re.sub(f"[{re.escape(string.punctuation)}]", "", text)
        text = " ".join(text.split())
        return text

so „ ” « » – … survive, cedilla ş ţ differ from comma-below ș ț, and "non-Hodgkin" becomes
"nonhodgkin". ``robust`` fixes those for Romanian.

Tokenisation for BLEU/METEOR in ``medqaro`` mode is NLTK ``word_tokenize`` with
``preserve_line=True``: the reference calls plain ``word_tokenize`` (punkt sentence split
first, then the Treebank word tokenizer per sentence). punkt data cannot be downloaded
here; for a single sentence both give identical tokens. They differ only where an answer
holds several sentences: a period ending an inner sentence stays attached ("Da." in
"Da. Nu") with ``preserve_line=True``. MedQARo answers are short (mean 4 tokens).
"""

from __future__ import annotations

import functools
import re
import string
import unicodedata

from medray.text import normalize

_ASCII_PUNCT = re.compile(f"[{re.escape(string.punctuation)}]")

# Typographic marks common in Romanian text; most are Unicode category P* anyway, listed
# explicitly so the intent survives any Unicode-table change.
_EXTRA_PUNCT = frozenset("„”“‟«»‹›–—‐‑…·•‚‘’′″")


def normalize_medqaro(text: str) -> str:
    """The reference ``normalize_text``: lowercase, delete ASCII punctuation, collapse spaces."""
    text = text.lower()
    text = _ASCII_PUNCT.sub("", text)
    return " ".join(text.split())


def _is_punct(ch: str) -> bool:
    return ch in string.punctuation or ch in _EXTRA_PUNCT or unicodedata.category(ch)[0] == "P"


@functools.lru_cache(maxsize=4096)
def _punct_table(text_chars: frozenset[str]) -> dict[int, None]:
    return {ord(c): None for c in text_chars if _is_punct(c)}


def fold_diacritics(text: str) -> str:
    """ă â -> a, î -> i, ș ş -> s, ț ţ -> t (and any other combining mark)."""
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize(
        "NFC", "".join(c for c in decomposed if not unicodedata.combining(c)))


def normalize_robust(text: str, fold: bool = False) -> str:
    """NFC + cedilla -> comma-below (medray.text.normalize), lowercase, delete ASCII and
    Unicode punctuation (category P*, „ ” « » – …), optional diacritic folding."""
    text = normalize(text).lower()
    text = text.translate(_punct_table(frozenset(text)))
    if fold:
        text = fold_diacritics(text)
    return " ".join(text.split())


@functools.lru_cache(maxsize=200_000)
def nltk_tokens(text: str) -> tuple[str, ...]:
    """``word_tokenize(text, preserve_line=True)``, memoised (answers repeat a lot)."""
    from nltk.tokenize import word_tokenize

    return tuple(word_tokenize(text, preserve_line=True))


@functools.lru_cache(maxsize=200_000)
def robust_tokens(text: str, fold: bool = False) -> tuple[str, ...]:
    return tuple(normalize_robust(text, fold).split())
