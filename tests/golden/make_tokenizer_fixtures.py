#!/usr/bin/env python3
"""Writes tests/golden/fixtures/tokenizer/<vocab>.txt: llama.cpp's token ids for a fixed set of
strings, for SmolLM2 and every byte-level BPE (tokenizer.ggml.model = gpt2) and SentencePiece
(tokenizer.ggml.model = llama) vocabulary in ../shared/testdata/vocab.

llama.cpp is the reference (built from its public source outside this repository); this script
only runs its `llama-tokenize` tool, one process per string, with the prompt passed as a binary file
(so invalid UTF-8 reaches the tokenizer unchanged) and escape processing off.

Environment:
  LLAMA_CPP_BIN   directory holding llama-tokenize (required)
  OSPREY_MODEL    SmolLM2 GGUF (default models/SmolLM2-135M-Instruct.Q4_1.gguf)
  OSPREY_SHARED   the shared directory (default ../shared next to the repository)

<vocab>@<pre>.txt are gpt-2's vocabulary with tokenizer.ggml.pre replaced by <pre>.

For SentencePiece vocabularies the script also writes detok/<vocab>.txt: llama_detokenize's text
for the ids of every string. llama-tokenize cannot show that, so a small helper is compiled against
libllama (LLAMA_CPP_INCLUDE: the directories holding llama.h and ggml.h, ':'-separated; default
include/ and ggml/include/ two levels above LLAMA_CPP_BIN). Its lines are
  <A> <hex input> <ids or -> <text 1> <text 2>
with A = add_special when tokenizing (parse_special is on); the texts (hex, '-' when empty) are
llama_detokenize's with remove_special off and unparse_special on (text 1), and with remove_special
on and unparse_special off (text 2).

Fixture format, one case per line, '#' starts a comment:
  <P><A> <hex of the input bytes, or '-' for empty> <ids separated by spaces, or '-' for none>
where P is 1/0 for parse_special on/off and A is 1/0 for add_special on/off.
"""
import os
import re
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = os.path.join(ROOT, "tests", "golden", "fixtures", "tokenizer")


# ---- the strings ---------------------------------------------------------------------------------

def strings():
    s = []
    # spaces in every position
    for t in ["a", "ab", "a b", "hello", "Hello world", "x  y", "1 2", "!", "é", "日本"]:
        s += [t, " " + t, t + " ", "  " + t, t + "  ", " " + t + " ", "   " + t + "   "]
    s += [" ", "  ", "   ", "    ", "\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n", "\n ", " \n ", "\t\n",
          "a\n\nb", "a \n b", "a\t\tb", "a\r\nb", "line1\nline2\n", "  \n\n  x", "x\n \n \ny",
          "\u00a0a", "a\u3000b", "a\u2003 b", "\u0085x", "\x0b\x0c", "a" + " " * 20 + "b", " " * 33]
    # code
    s += ["def f(x):\n    return x + 1\n", "int main() { return 0; }", "for (i = 0; i < n; ++i) {}",
          "if x != y:\n\tpass", "#include <stdio.h>", "a->b.c[0] += 0x1F;", "console.log(`${a}`)",
          "SELECT * FROM t WHERE id = 42;", "    indented\n        more", "x=[1,2,3]\ny={'a':1}",
          "<div class=\"c\">hi</div>", "$HOME/path/to/file.txt", "a && b || !c", "__init__", "~/.bashrc"]
    # digits of many lengths
    for n in range(1, 13):
        s.append("1234567890123"[:n])
    s += ["3.14159", "1,000,000", "2024-01-31", "v1.2.3", "100%", "$9.99", "0x7fff", "1e-9", "١٢٣",
          "x1y22z333", "Ⅻ and ½ and ²"]
    # contractions and case
    s += ["I'm here, you're there, it's fine", "DON'T STOP", "we'll've'd", "'s", "rock'n'roll", "O'Neil"]
    # scripts
    s += ["日本語のテキストです。", "中文字符测试", "한국어 텍스트", "Ελληνικά κείμενα", "Привет, мир!",
          "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีครับ", "עברית", "Tiếng Việt có dấu",
          "Äpfel Öl Übermut ß", "naïve café résumé", "e\u0301 combining", "ﬁ ligature", "Ｆｕｌｌｗｉｄｔｈ"]
    # emoji
    s += ["🦙", "🦙.cpp", "👋🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷🇩🇪", "a😀b", " 😀 ", "🤖🤖🤖"]
    # special/control token text
    s += ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>\n",
          "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
          "text<|endoftext|>more", " <|endoftext|> ", "<|endoftext|><|endoftext|>", "<|im_start", "<s></s>",
          "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "<fim-prefix>x", "<|EOT|>", "<｜begin▁of▁sentence｜>hi"]
    # mixed
    s += ["Hello, 世界! 123 🦙\n\tok", "¡Hola! ¿Qué tal?", "Ünïcödé 😀 日本 123\n",
          "mixed: abc123def456", "email@example.com https://x.org/a?b=c#d", "A-B_C.D/E\\F",
          "...!!!???", "\"quoted\" 'single'", "tab\tseparated\tvalues"]
    out = [t.encode("utf-8") for t in s]
    # invalid UTF-8
    out += [b"\xff", b"abc\xffdef", b"\xc3", b"\xc3(", b"\xe2\x82", b"a\xe2\x82b", b"\xf0\x9f\x98",
            b"\xf0\x9f\x98 x", b"\x80\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xfe\xfe\xff", b" \xe6\x97\xa5\xe6",
            b"\xf8\x88\x80\x80\x80"]
    seen, uniq = set(), []
    for b in out:
        if b not in seen:
            seen.add(b)
            uniq.append(b)
    return uniq


# extra strings for SentencePiece vocabularies (appended to the common list for them only): the
# escape char itself, byte-token and control-token texts, spaces around special tokens
SPM_EXTRA = ["\u2581", "\u2581\u2581x", "a\u2581b", " \u2581 ", "<0x41>", "<unk>", "<s>hello</s>", " <s> x ",
             "<s>", "</s>", "a</s>", "<|user|>\nhi<|end|>\n<|assistant|>", "<|endoftext|>  x", "x <|end|> y",
             "[PAD32011]", "<SEP><CLS>", "\U0001F999\u2581\U0001F999", "\x00", "a\x00b", "\x7f"]


# strings also run with parse_special off and with add_special on
def subset_modes(i, b):
    modes = ["10"]
    if b"<" in b or i % 10 == 0:
        modes.append("00")
    if i % 12 == 0 or b.startswith(b"<|im_start|>"):
        modes.append("11")
    return modes


# ---- GGUF metadata (just enough to read tokenizer.ggml.model) ----------------------------------

def gguf_model_type(path):
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            return None
        f.read(4)
        _, n_kv = struct.unpack("<QQ", f.read(16))

        def rstr():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        def skip(t):
            if t == 8:
                rstr()
            elif t == 9:
                (et,) = struct.unpack("<I", f.read(4))
                (n,) = struct.unpack("<Q", f.read(8))
                if et in sizes:
                    f.seek(sizes[et] * n, 1)
                else:
                    for _ in range(n):
                        skip(et)
            else:
                f.seek(sizes[t], 1)

        for _ in range(n_kv):
            key = rstr().decode()
            (t,) = struct.unpack("<I", f.read(4))
            if key == "tokenizer.ggml.model" and t == 8:
                return rstr().decode()
            skip(t)
    return None


def gguf_with_pre(path, pre):
    """The bytes of a tensor-less vocabulary GGUF with tokenizer.ggml.pre set to `pre` (added or
    replaced), so one vocabulary can exercise many pre-tokenizers. The C test builds the same file
    in memory."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        data = f.read()
    pos = 4
    version, = struct.unpack_from("<I", data, pos)
    n_tensors, n_kv = struct.unpack_from("<QQ", data, pos + 4)
    assert n_tensors == 0, "only tensor-less vocabulary files"
    pos += 20

    def skip_val(t, p):
        if t == 8:
            n, = struct.unpack_from("<Q", data, p)
            return p + 8 + n
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, p)
            p += 12
            if et in sizes:
                return p + sizes[et] * n
            for _ in range(n):
                p = skip_val(et, p)
            return p
        return p + sizes[t]

    kvs = []
    for _ in range(n_kv):
        kl, = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8:pos + 8 + kl].decode()
        t, = struct.unpack_from("<I", data, pos + 8 + kl)
        end = skip_val(t, pos + 12 + kl)
        if key != "tokenizer.ggml.pre":
            kvs.append(data[pos:end])
        pos = end
    pre_b = pre.encode()
    key = b"tokenizer.ggml.pre"
    kvs.append(struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, len(pre_b)) + pre_b)
    out = b"GGUF" + struct.pack("<IQQ", version, 0, len(kvs)) + b"".join(kvs)
    return out + b"\0" * (-len(out) % 32)


# gpt-2's vocabulary under other pre-tokenizers (llama.cpp's own files for these are not in
# ../shared): covers the hand-written Llama-3 / Qwen2 / Qwen3.5 splitters and more regexes
EXTRA_PRES = ["llama-bpe", "qwen2", "qwen35", "deepseek-v3", "gpt-4o", "tekken", "poro-chat", "dbrx",
              "chatglm-bpe", "seed-coder", "minicpm5", "viking", "jais-2", "youtu", "spark2_5", "bailingmoe",
              "exaone-moe", "granite-embed-multi-97m", "chameleon", "laguna"]


# ---- llama_detokenize through a helper linked against libllama ---------------------------------

DETOK_HELPER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"

static int unhex(const char *h, char *out) {
    int n = 0;
    for (; h[0] && h[1] && h[0] != '\n'; h += 2) {
        unsigned v;
        sscanf(h, "%2x", &v);
        out[n++] = (char)v;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    llama_log_set(NULL, NULL);
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    const struct llama_vocab *v = llama_model_get_vocab(m);
    static char line[1 << 16], in[1 << 15], text[1 << 17];
    static llama_token ids[1 << 15];
    while (fgets(line, sizeof line, stdin)) {
        int n_in = line[0] == '-' ? 0 : unhex(line, in);
        for (int add = 0; add < 2; add++) {
            int n = llama_tokenize(v, in, n_in, ids, 1 << 15, add, true);
            if (n < 0) continue;
            printf("%d ", add);
            if (n_in == 0) printf("-");
            for (int i = 0; i < n_in; i++) printf("%02x", (unsigned char)in[i]);
            printf(" ");
            if (n == 0) printf("-");
            for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
            for (int k = 0; k < 2; k++) {
                int len = llama_detokenize(v, ids, n, text, sizeof text, k == 1, k == 0);
                printf(" ");
                if (len <= 0) printf("-");
                for (int i = 0; i < len; i++) printf("%02x", (unsigned char)text[i]);
            }
            printf("\n");
        }
    }
    llama_model_free(m);
    return 0;
}
"""


def build_detok_helper(bindir, tmpdir):
    inc = os.environ.get("LLAMA_CPP_INCLUDE")
    src_root = os.path.dirname(os.path.dirname(os.path.abspath(bindir)))
    dirs = inc.split(":") if inc else [os.path.join(src_root, "include"), os.path.join(src_root, "ggml", "include")]
    c = os.path.join(tmpdir, "detok_helper.c")
    exe = os.path.join(tmpdir, "detok_helper")
    with open(c, "w") as f:
        f.write(DETOK_HELPER)
    cmd = ["cc", "-O1", "-o", exe, c] + [f"-I{d}" for d in dirs] + [f"-L{bindir}", f"-Wl,-rpath,{bindir}", "-lllama"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print("cannot build the llama_detokenize helper; detok fixtures skipped:\n" + r.stderr, file=sys.stderr)
        return None
    return exe


def write_detok_fixture(helper, name, path, cases):
    inp = "".join((b.hex() or "-") + "\n" for b in cases)
    r = subprocess.run([helper, path], input=inp.encode(), capture_output=True, check=True)
    out_dir = os.path.join(OUT_DIR, "detok")
    os.makedirs(out_dir, exist_ok=True)
    lines = [f"# llama.cpp llama_detokenize text for {os.path.basename(path)}; written by "
             "tests/golden/make_tokenizer_fixtures.py",
             "# <add_special> <hex input> <ids> <hex text: remove_special 0, unparse_special 1> <1, 0>"]
    lines += r.stdout.decode().splitlines()
    with open(os.path.join(out_dir, name + ".txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{name}: {len(lines) - 2} detokenize cases", flush=True)


# ---- running llama.cpp --------------------------------------------------------------------------

def llama_ids(binary, vocab, data, parse_special, add_special):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
        name = f.name
    try:
        cmd = [binary, "-m", vocab, "-bf", name, "--ids", "--log-disable", "--no-escape"]
        if not parse_special:
            cmd.append("--no-parse-special")
        if not add_special:
            cmd.append("--no-bos")
        r = subprocess.run(cmd, capture_output=True, check=False)
    finally:
        os.unlink(name)
    if r.returncode != 0:
        return None
    m = re.search(rb"\[([0-9, ]*)\]\s*$", r.stdout)
    if not m:
        return None
    return [int(x) for x in m.group(1).split(b",") if x.strip()]


def main():
    bindir = os.environ.get("LLAMA_CPP_BIN")
    if not bindir:
        sys.exit("set LLAMA_CPP_BIN to the directory holding llama.cpp's llama-tokenize")
    binary = os.path.join(bindir, "llama-tokenize")
    model = os.environ.get("OSPREY_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    shared = os.environ.get("OSPREY_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
    vocab_dir = os.path.join(shared, "testdata", "vocab")

    vocabs = [("smollm2", model)]
    for fn in sorted(os.listdir(vocab_dir)):
        if fn.startswith("ggml-vocab-") and fn.endswith(".gguf"):
            p = os.path.join(vocab_dir, fn)
            if gguf_model_type(p) in ("gpt2", "llama"):
                vocabs.append((fn[len("ggml-vocab-"):-len(".gguf")], p))
    gpt2 = dict(vocabs).get("gpt-2")
    tmpdir = tempfile.mkdtemp()
    if gpt2:
        for pre in EXTRA_PRES:
            p = os.path.join(tmpdir, f"gpt-2@{pre}.gguf")
            with open(p, "wb") as f:
                f.write(gguf_with_pre(gpt2, pre))
            vocabs.append((f"gpt-2@{pre}", p))
    only = sys.argv[1:]
    helper = None
    os.makedirs(OUT_DIR, exist_ok=True)
    for name, path in vocabs:
        if only and name not in only:
            continue
        cases = strings()
        if gguf_model_type(path) == "llama":
            cases += [t.encode("utf-8") for t in SPM_EXTRA if t.encode("utf-8") not in cases]
        lines = [f"# llama.cpp llama-tokenize ids for {os.path.basename(path)}; written by "
                 "tests/golden/make_tokenizer_fixtures.py", "# <parse_special><add_special> <hex input> <ids>"]
        n = 0
        for i, b in enumerate(cases):
            for mode in subset_modes(i, b):
                ids = llama_ids(binary, path, b, mode[0] == "1", mode[1] == "1")
                if ids is None:
                    lines.append(f"# llama-tokenize failed on {b.hex()} mode {mode}; skipped")
                    continue
                lines.append(f"{mode} {b.hex() or '-'} {' '.join(map(str, ids)) or '-'}")
                n += 1
        with open(os.path.join(OUT_DIR, name + ".txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{name}: {n} cases", flush=True)
        if gguf_model_type(path) == "llama":
            helper = helper or build_detok_helper(bindir, tmpdir)
            if helper:
                write_detok_fixture(helper, name, path, cases)


if __name__ == "__main__":
    main()
