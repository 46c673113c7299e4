#!/usr/bin/env bash
# Puts the perplexity text of issue 13's accuracy report into models/ppl/: docutils' design essay
# "Problems With StructuredText / Alternatives" (docs/dev/rst/alternatives.txt, 113 KB of English
# prose, ~25k tokens for SmolLM2's tokenizer; public domain, as docutils' documentation says), taken
# from the docutils 0.21.2 source distribution on PyPI, whose sha256 and the file's are checked.
#   usage: scripts/fetch-ppl-text.sh        then: osprey perplexity -m MODEL -f models/ppl/docutils-alternatives.txt
# Idempotent: a text already present with the right hash is left alone and no network is touched.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${OSPREY_MODELS_DIR:-$ROOT/models}/ppl/docutils-alternatives.txt"
SDIST_SHA=3a6b18732edf182daa3cd12775bbb338cf5691468f91eeeb109deff6ebfa986f
TEXT_SHA=b5e78cfa1b38316ad2e8dc94d4cf9d16bf01059c250614aa6948b463bb54ba02
if [ -f "$DEST" ] && echo "$TEXT_SHA  $DEST" | sha256sum -c --quiet - 2>/dev/null; then exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d "$tmp" docutils==0.21.2
echo "$SDIST_SHA  $tmp/docutils-0.21.2.tar.gz" | sha256sum -c --quiet - || { echo "fetch-ppl-text: the sdist's sha256 differs" >&2; exit 1; }
tar -C "$tmp" -xzf "$tmp/docutils-0.21.2.tar.gz" docutils-0.21.2/docs/dev/rst/alternatives.txt
src="$tmp/docutils-0.21.2/docs/dev/rst/alternatives.txt"
echo "$TEXT_SHA  $src" | sha256sum -c --quiet - || { echo "fetch-ppl-text: the text's sha256 differs" >&2; exit 1; }
mkdir -p "$(dirname "$DEST")"
cp "$src" "$DEST.tmp" && mv "$DEST.tmp" "$DEST"
echo "fetch-ppl-text: $DEST"
