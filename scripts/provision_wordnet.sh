#!/usr/bin/env bash
# Provision the English WordNet 3.0 for NLTK, offline-friendly and idempotent.
#
# usage: scripts/provision_wordnet.sh [VENV]        (default: .venv)
#
# Why: NLTK cannot download data here, and METEOR (mode medqaro) needs WordNet. Debian ships
# WordNet 3.0 as `wordnet-base` (+ `wordnet-sense-index`) in /usr/share/wordnet. NLTK looks in
# `sys.prefix/nltk_data`, so the files are COPIED (NLTK 3.10 rejects symlinks that leave the
# corpus root) into $VENV/nltk_data/corpora/wordnet/, plus the `lexnames` file Debian lacks.
# If apt is impossible (not root, offline), print a warning and exit 0: METEOR then runs
# without synonyms and `medray score` reports "meteor_wordnet": false.
set -euo pipefail

VENV="${1:-.venv}"
SRC=/usr/share/wordnet
DEST="$VENV/nltk_data/corpora/wordnet"

warn() { echo "provision_wordnet: WARNING: $*" >&2; }

if [ ! -d "$VENV" ]; then
    warn "venv '$VENV' does not exist; nothing provisioned"
    exit 0
fi

if [ ! -f "$SRC/data.noun" ] || [ ! -f "$SRC/index.sense" ]; then
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        warn "$SRC missing and apt-get unavailable (need root + apt); METEOR will run without WordNet"
        exit 0
    fi
    # apt and dpkg print progress even with -qq; keep it in a log shown only on failure.
    apt_log="$(mktemp)"
    if ! { apt-get update -qq && \
           DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
               wordnet-base wordnet-sense-index; } >"$apt_log" 2>&1; then
        cat "$apt_log" >&2
        rm -f "$apt_log"
        warn "apt-get could not install wordnet-base/wordnet-sense-index; METEOR will run without WordNet"
        exit 0
    fi
    rm -f "$apt_log"
    echo "provision_wordnet: installed Debian's wordnet-base and wordnet-sense-index"
fi
if [ ! -f "$SRC/data.noun" ]; then
    warn "$SRC/data.noun still missing after install; METEOR will run without WordNet"
    exit 0
fi

mkdir -p "$DEST"
# -L: dereference, so only regular files land in the corpus root.
for f in "$SRC"/*; do
    [ -f "$f" ] || continue
    cp -L --preserve=timestamps "$f" "$DEST/$(basename "$f")"
done

# The 45 standard WordNet 3.0 lexicographer files: number, name, syntactic category
# (1 noun, 2 verb, 3 adjective, 4 adverb). NLTK asserts the numbering is consecutive.
cat > "$DEST/lexnames.tmp" <<'LEX'
00	adj.all	3
01	adj.pert	3
02	adv.all	4
03	noun.Tops	1
04	noun.act	1
05	noun.animal	1
06	noun.artifact	1
07	noun.attribute	1
08	noun.body	1
09	noun.cognition	1
10	noun.communication	1
11	noun.event	1
12	noun.feeling	1
13	noun.food	1
14	noun.group	1
15	noun.location	1
16	noun.motive	1
17	noun.object	1
18	noun.person	1
19	noun.phenomenon	1
20	noun.plant	1
21	noun.possession	1
22	noun.process	1
23	noun.quantity	1
24	noun.relation	1
25	noun.shape	1
26	noun.state	1
27	noun.substance	1
28	noun.time	1
29	verb.body	2
30	verb.change	2
31	verb.cognition	2
32	verb.communication	2
33	verb.competition	2
34	verb.consumption	2
35	verb.contact	2
36	verb.creation	2
37	verb.emotion	2
38	verb.motion	2
39	verb.perception	2
40	verb.possession	2
41	verb.social	2
42	verb.stative	2
43	verb.weather	2
44	adj.ppl	3
LEX
mv -f "$DEST/lexnames.tmp" "$DEST/lexnames"

echo "provision_wordnet: WordNet copied to $DEST"
if [ -x "$VENV/bin/python" ]; then
    if "$VENV/bin/python" -c "from nltk.corpus import wordnet as wn; assert wn.synsets('dog')" \
        >/dev/null 2>&1; then
        echo "provision_wordnet: nltk.corpus.wordnet.synsets('dog') OK"
    else
        warn "NLTK could not read $DEST (is nltk installed in $VENV?)"
    fi
fi
