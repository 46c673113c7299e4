#!/usr/bin/env bash
# The retrieval check of issue 13: the sentence "The secret code of <city> is <5 digits>." placed at
# 10 depths (0 %, 11 %, ..., 100 % of the filler) of a filler text of about N tokens, followed by
# "What is the secret code of <city>?" and the answer's opening words, continued greedily (temperature
# 0) for 8 tokens, with each KV cache configuration; a code counts as retrieved when its 5 digits
# appear in the continuation. The rule (issue 13): fp8 and nvfp4 retrieve every code f16 retrieves.
# The filler is a fixed Debian text (/usr/share/common-licenses/GPL-3 by default, cut at a sentence
# end); cities and codes come from a fixed seed, so every run asks the same questions.
# Prints, per length, one line per configuration (codes retrieved, the depths missed, and the codes f16
# retrieved that this configuration missed) and a markdown table for bench/RESULTS.md.
# usage: bench/kv/retrieval.sh [MODEL] [SCALES (a calibrate-kv file, for the "+cal" rows; "" for none)]
#        [LENGTHS ("2048 6144")] [CONFIGS ("f16 fp8 nvfp4 fp8+cal nvfp4+cal")] [FILLER]
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
SCALES=${2:-}
LENGTHS=${3:-2048 6144}
CONFIGS=${4:-f16 fp8 nvfp4 fp8+cal nvfp4+cal}
FILLER=${5:-/usr/share/common-licenses/GPL-3}
BIN=${OSPREY_BUILD:-build}/bin/osprey
[ -x "$BIN" ] || { echo "build $BIN first" >&2; exit 1; }
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include tools || echo -dirty), $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($(nproc) cores)"
echo "command: $0 $MODEL '${SCALES}' '$LENGTHS' '$CONFIGS' $FILLER"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for N in $LENGTHS; do
  # the prompts: 10 depths, one city and code each (python: deterministic cut and placement)
  python3 - "$FILLER" "$N" "$tmp" <<'PY'
import random, re, sys
filler_path, n_tok, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
text = re.sub(r"\s+", " ", open(filler_path, encoding="utf-8").read()).strip()
sents = re.split(r"(?<=[.;:])\s+", text)
# about 4.6 characters a token for this English text (SmolLM2's tokenizer); the script reports the
# real count from osprey tokenize
want_chars = int(n_tok * 4.6)
body, k = [], 0
while sum(len(s) + 1 for s in body) < want_chars:
    body.append(sents[k % len(sents)])
    k += 1
cities = ["Paris", "Lisbon", "Nairobi", "Osaka", "Lima", "Oslo", "Dakar", "Hanoi", "Quito", "Perth"]
rng = random.Random(13)
for d in range(10):
    city = cities[d]
    code = "%05d" % rng.randrange(10000, 100000)
    at = round(d * len(body) / 9)
    parts = body[:at] + ["The secret code of %s is %s." % (city, code)] + body[at:]
    prompt = " ".join(parts) + "\n\nWhat is the secret code of %s? The secret code of %s is" % (city, city)
    open("%s/p%d.txt" % (out, d), "w").write(prompt)
    open("%s/c%d.txt" % (out, d), "w").write(code)
PY
  ntok=$("$BIN" tokenize -m "$MODEL" -p "$(cat "$tmp/p9.txt")" | tr ',' '\n' | wc -l)
  echo "## filler of about $N tokens (prompt: $ntok tokens)"
  for cfg in $CONFIGS; do
    dt=${cfg%+cal}
    extra=()
    if [ "$cfg" != "$dt" ]; then
      [ -n "$SCALES" ] || { echo "$cfg: skipped (no scales file given)"; continue; }
      extra=(--kv-scales "$SCALES")
    fi
    got=0 missed=""
    for d in $(seq 0 9); do
      # generate prints the prompt, then the continuation: a code counts when the output holds it more
      # often than the prompt does (at depth 100 % the sentence is in the prompt's last lines)
      "$BIN" generate -m "$MODEL" -t "$(nproc)" --temp 0 -n 8 --kv-cache-dtype "$dt" "${extra[@]}" \
          -p "$(cat "$tmp/p$d.txt")" >"$tmp/out" 2>/dev/null
      code=$(cat "$tmp/c$d.txt")
      out=$(tail -c +"$(($(wc -c <"$tmp/p$d.txt") + 1))" "$tmp/out")
      if [ "$(grep -o "$code" "$tmp/out" | wc -l)" -gt "$(grep -o "$code" "$tmp/p$d.txt" | wc -l)" ]; then got=$((got + 1)); echo "$N $cfg $d 1" >>"$tmp/res"
      else missed="$missed $d"; echo "$N $cfg $d 0" >>"$tmp/res"; fi
      echo "  $cfg depth $d (code $code): $(tr '\n' ' ' <<<"$out" | cut -c1-60)" >&2
    done
    lost=$(awk -v n="$N" -v c="$cfg" '$1 == n && $2 == "f16" && $4 == 1 {f[$3] = 1} $1 == n && $2 == c && $4 == 0 && f[$3] {printf " %s", $3}' "$tmp/res")
    echo "$cfg: $got / 10 retrieved; missed depths:${missed:- none}; f16's codes missed:${lost:- none}"
  done
done
echo
echo "| filler tokens | config | retrieved / 10 | f16's codes missed |"
echo "|---|---|---|---|"
awk '{k = $1 " " $2; n[k] += $4; if (!(k in o)) {o[k] = ++m; key[m] = k}}
     $2 == "f16" && $4 == 1 {f[$1 " " $3] = 1}
     $4 == 0 && f[$1 " " $3] {lost[$1 " " $2]++}
     END {for (i = 1; i <= m; i++) {split(key[i], a, " "); printf "| %s | %s | %d | %d |\n", a[1], a[2], n[key[i]], lost[key[i]] + 0}}' "$tmp/res"
