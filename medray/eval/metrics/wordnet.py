"""Offline synonym sources for NLTK's METEOR: English WordNet and Romanian RoWordNet.

NLTK's METEOR only touches ``wordnet.synsets(word)``, then ``synset.lemmas()`` and
``lemma.name()`` (skipping names with "_"). Every source here exposes exactly that
interface, memoised per word, so the result equals NLTK's own and each word is looked up
once per process instead of once per scored pair.

- English WordNet (mode ``medqaro``): ``nltk.corpus.wordnet`` read from
  ``sys.prefix/nltk_data`` (provisioned by ``scripts/provision_wordnet.sh``). Never
  downloaded at run time; if it is missing METEOR runs without synonyms
  (``available=False``, reported as ``"meteor_wordnet": false``).
- RoWordNet (mode ``robust``): METEOR's synonym stage sees STEMMED words (the stem stage
  runs first and hands on stems), so the Romanian index maps a Snowball stem to the stems
  of every single-word literal sharing a synset with any literal of that stem.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from medray.text import normalize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Lemma:
    _name: str

    def name(self) -> str:
        return self._name


@dataclass(frozen=True)
class _Synset:
    _lemmas: tuple[_Lemma, ...]

    def lemmas(self) -> tuple[_Lemma, ...]:
        return self._lemmas


class SynonymSource:
    """WordNet-like object for ``meteor_score(..., wordnet=...)`` backed by ``lookup``.

    ``persist``: a pickle of word -> synonym names, read at start and rewritten by ``save()``
    when new words were looked up, so later runs need not load WordNet at all.
    """

    def __init__(self, lookup: Callable[[str], Iterable[str]], name: str, available: bool,
                 persist: Path | None = None):
        self._lookup = lookup
        self.name = name
        self.available = available
        self._persist = persist
        self._names: dict[str, tuple[str, ...]] = {}
        self._dirty = False
        if persist is not None and persist.is_file():
            try:
                with persist.open("rb") as f:
                    self._names = pickle.load(f)
            except (OSError, pickle.UnpicklingError, EOFError):
                self._names = {}
        self._cache: dict[str, list[_Synset]] = {}

    def synsets(self, word: str) -> list[_Synset]:
        hit = self._cache.get(word)
        if hit is None:
            names = self._names.get(word)
            if names is None:
                names = self._names[word] = tuple(sorted(set(self._lookup(word))))
                self._dirty = True
            hit = [_Synset(tuple(_Lemma(n) for n in names))] if names else []
            self._cache[word] = hit
        return hit

    def synonyms(self, word: str) -> set[str]:
        return {lem.name() for s in self.synsets(word) for lem in s.lemmas()}

    def save(self) -> None:
        if self._persist is None or not self._dirty:
            return
        _atomic_pickle(self._names, self._persist)
        self._dirty = False


def _atomic_pickle(obj: object, path: Path) -> None:
    from medray.io import write_bytes_atomic

    try:
        write_bytes_atomic(path, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:  # a read-only cache dir only costs speed
        pass


def empty_source(name: str = "none") -> SynonymSource:
    """No synonyms at all: METEOR degrades to exact + stem matching."""
    return SynonymSource(lambda _w: (), name=name, available=False)


def _cache_dir() -> Path:
    base = os.environ.get("MEDRAY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "medray")
    return Path(base)


def _key(*parts: object) -> str:
    return hashlib.sha1(":".join(map(str, parts)).encode()).hexdigest()[:16]


# --- English WordNet -------------------------------------------------------------------------


@functools.cache
def english_wordnet() -> SynonymSource:
    """NLTK's WordNet behind a per-word cache (memory + disk); empty if not installed.

    The corpus is located without loading it (loading costs 8-20 s here); it is loaded on
    the first word missing from the disk cache.
    """
    import nltk.data

    try:
        root = nltk.data.find("corpora/wordnet")
    except LookupError:  # not provisioned: never download at run time
        log.warning("NLTK WordNet not found; METEOR runs without synonyms. "
                    "Run scripts/provision_wordnet.sh .venv")
        return empty_source("wordnet-missing")
    path = Path(str(getattr(root, "path", root)))
    probe = path / "data.noun" if path.is_dir() else path
    stamp = probe.stat().st_mtime_ns if probe.exists() else 0
    persist = _cache_dir() / f"wordnet-synonyms-{_key(path, stamp, 'v1')}.pkl"

    def lookup(word: str) -> Iterable[str]:
        from nltk.corpus import wordnet as wn

        return (lem.name() for syn in wn.synsets(word) for lem in syn.lemmas())

    return SynonymSource(lookup, name="nltk-wordnet-3.0", available=True, persist=persist)


# --- Romanian WordNet ------------------------------------------------------------------------


def build_stem_index(
    literal_sets: Iterable[Iterable[str]],
    stem: Callable[[str], str],
    fold: Callable[[str], str] | None = None,
) -> dict[str, frozenset[str]]:
    """stem -> stems of all single-word literals that share a synset with a literal of it.

    Multi-word literals ("tumoare_malignă") are skipped: METEOR aligns single tokens.
    """
    members: dict[str, set[str]] = defaultdict(set)
    for literals in literal_sets:
        stems = set()
        for lit in literals:
            if "_" in lit or " " in lit:
                continue
            word = normalize(lit).lower()  # NFC, cedilla -> comma-below, like the answers
            if fold is not None:
                word = fold(word)
            stems.add(stem(word))
        for s in stems:
            members[s] |= stems
    return {s: frozenset(v) for s, v in members.items()}


def stem_index_source(index: dict[str, frozenset[str]], name: str) -> SynonymSource:
    return SynonymSource(lambda w: index.get(w, ()), name=name, available=True)


def _rowordnet_pickle() -> Path | None:
    try:
        import rowordnet
    except ImportError:
        return None
    path = Path(rowordnet.__file__).with_name("rowordnet.pickle")
    return path if path.is_file() else None


@functools.cache
def romanian_wordnet(fold_diacritics: bool = False) -> SynonymSource:
    """RoWordNet synonyms over Romanian Snowball stems; lazy, cached per process and on disk.

    Loading the bundled pickle takes seconds, so the derived stem index (small) is cached
    under ``$MEDRAY_CACHE`` (default ~/.cache/medray), keyed by the pickle's size and mtime.
    """
    from nltk.stem.snowball import SnowballStemmer

    from medray.eval.metrics.textnorm import fold_diacritics as fold

    src = _rowordnet_pickle()
    if src is None:
        log.warning("rowordnet not installed; robust METEOR runs without synonyms")
        return empty_source("rowordnet-missing")
    st = src.stat()
    key = _key(src, st.st_size, st.st_mtime_ns, fold_diacritics, "v2")
    cache = _cache_dir() / f"rowordnet-stems-{key}.pkl"
    name = "rowordnet" + ("+fold" if fold_diacritics else "")
    if cache.is_file():
        try:
            with cache.open("rb") as f:
                return stem_index_source(pickle.load(f), name)
        except (OSError, pickle.UnpicklingError, EOFError):
            pass  # rebuild below
    with src.open("rb") as f:
        # The pickle IS a RoWordNet object; `RoWordNet(filename=...)` unpickles it and then
        # rebuilds networkx graphs we do not need (~3x slower), so read it directly.
        wn = pickle.load(f)
    stemmer = SnowballStemmer("romanian")
    index = build_stem_index(
        (wn.synset(sid).literals for sid in wn.synsets()),
        stemmer.stem,
        fold if fold_diacritics else None,
    )
    _atomic_pickle(index, cache)
    return stem_index_source(index, name)
