#!/usr/bin/env python3
# hf_parity: our HfTokenizer (through hf_encode_tool) against the Hugging Face `tokenizers`
# library, token for token. Invariant checked: for every tokenizer and text below, our ids equal
# `Tokenizer.encode(raw.decode("utf-8", "replace"), add_special_tokens=False).ids`, and our
# decode gives the text back (the replaced text for invalid UTF-8).
# Usage: hf_parity.py HF_ENCODE_TOOL SOURCE_DIR. Exits 77 (skipped) without `tokenizers` or
# without the `bible` command (Debian bible-kjv).
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

try:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:
    print(f"hf_parity: skipped: python3 cannot import tokenizers ({e}); "
          "scripts/install_deps.sh installs it")
    sys.exit(77)

TOOL = sys.argv[1]
if shutil.which("bible") is None:
    print("hf_parity: skipped: no `bible` command (Debian package bible-kjv)")
    sys.exit(77)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<pad>", "<sep>", "<cls>", "[NOTE]"]


def kjv() -> bytes:
    return subprocess.run(["bible", "Gen1:1-Rev22:21"], check=True,
                          stdout=subprocess.PIPE).stdout


def texts(kjv_bytes: bytes) -> dict:
    multilingual = (
        "中文分词测试：我们今天去北京，天气很好！ 日本語のテキストも。 한국어 문장입니다.\n"
        "العربية: مرحبا بالعالم، كيف حالك؟ ٣٤٥٦\n"
        "हिन्दी: नमस्ते दुनिया, यह एक परीक्षण है। १२३४\n"
        "Русский: Съешь же ещё этих мягких французских булок, да выпей чаю.\n"
        "Ελληνικά: Καλημέρα κόσμε. Ünïcödé àccénts: café naïve résumé Ærøskøbing Œuvre\n"
        "combining: e\u0301 a\u0308 n\u0303 Z\u0335\u0321a\u0336\u0322l\u0337g\u0334o\n"
        "emoji: 👨‍👩‍👧‍👦 👩🏽‍💻 👍🏻👍🏿 🏳️‍🌈 🇫🇷🇯🇵 ❤️‍🔥 🤷‍♀️ 😀😃😄 ✌🏾\n"
        "case: I'M YOU'RE THEY'VE WE'LL IT'S SHE'D don't ſ K Kelvin \u212a\n"
        "mongolian a  \u180e  the a \u180eb \u180e\u180e! \u180e x\u180e\n"
        "mixed\u180e separators\u200b zero\u2060width \ufeffbom x\u2028y\u2029z\u0085w\n"
        "math 𝔸𝔹ℂ ∑∫∂ ½ ² ³ Ⅻ ⑩ 𝟘𝟙𝟚\n")
    whitespace = (
        "\t\ttabs\tand  double  spaces   triple\r\nCRLF\r\n\r\nlines\n\n\n"
        "   leading and trailing   \n 1234567 12 123 1234 0.5 3,141,592 1e10 -42\n"
        "...!!! ??? !?!? --- *** ((( ))) [[]] {{}} @@ ## $$ %% ^^ && __ ~~ `` ''\n"
        "nbsp\u00a0here ideographic\u3000space em\u2003space thin\u2009space \u00a0\u00a0 \u3000\n"
        "quotes 'tis 's 'S 're 've 'm 'll 'd ' s' \"hi\"\n"
        " \n \t \r \x0b \x0c  x  \n\n  \t  ")
    special = (
        "Hello<|endoftext|>world <pad> x  <pad>  y<sep>  z <cls>  w é <pad>\u3000<pad>\u00a0end"
        "<|endoftext|><|endoftext|><pad><pad> a[NOTE]b [NOTE] <|endoftext|>\n<pad>\n  <sep>\t"
        "<|endoftext|  <|end <pad <cls>\u00a0\u00a0é<sep>x\u2003<cls>\u2003y")
    invalid = (b"abc\xff\xfe def \xc3 \xe2\x82 x\xf0\x9f\x98 end \xed\xa0\x80 \xc0\xaf "
               b"\xf4\x90\x80\x80 ok\x80 \xe0\x80\x80 \xf0\x80 \xc3\xa9\xa9 \xf5\xf8 "
               b"<pad>\xff<pad> \xef\xbf\xbd real replacement\xe2\x82")
    rng = random.Random(1234)
    pieces = ["the", " The", "LORD", " ", "  ", "\n", "\r\n", "\t", "123", "4567", ",", ".",
              "!!", "'s", "'LL", "é", "中文", "👍🏽", "\u00a0", "\u3000", "<pad>",
              "<|endoftext|>", "[NOTE]", "سلام", "नमस्ते", "ё", "a", "z", "?", "\u200d", "\u0301",
              "😀", " ", "\n\n", "--", "<", "|", ">"]
    fuzz = "".join(rng.choice(pieces) for _ in range(20000))
    return {
        "kjv": kjv_bytes,
        "multilingual": multilingual.encode(),
        "whitespace": whitespace.encode(),
        "special": special.encode(),
        "invalid_utf8": invalid,
        "fuzz": fuzz.encode(),
    }


def train(kjv_bytes: bytes) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4000, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    lines = kjv_bytes.decode().splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer)
    return tok


def byte_map() -> list:
    """GPT-2's bytes_to_unicode: byte -> the printable character that stands for it."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


BYTE_MAP = byte_map()


def configs(base: Tokenizer, kjv_words: set) -> dict:
    gpt2 = json.loads(base.to_str())
    llama = json.loads(base.to_str())
    llama["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}
    llama["model"]["ignore_merges"] = True
    # Whole words that BPE would split, added to the vocab with no merge that makes them: only
    # the ignore_merges rule (a pre-token found in the vocab is one token) can produce them.
    vocab = llama["model"]["vocab"]
    words = sorted({w for w in kjv_words if len(w) >= 9})
    # " \u180e" is one pre-token only where U+180E is not whitespace (Oniguruma's \s); the
    # KJV vocabulary has no merge that would show a different split otherwise.
    for w in words[:400] + ["\u180e"]:
        mapped = "".join(BYTE_MAP[b] for b in (" " + w).encode())
        vocab.setdefault(mapped, len(vocab))
    # Merges in the old "a b" string form.
    llama["model"]["merges"] = [" ".join(m) for m in llama["model"]["merges"]]
    special = Tokenizer.from_str(base.to_str())
    special.add_special_tokens([
        AddedToken("<pad>", lstrip=True, rstrip=True, normalized=False),
        AddedToken("<sep>", lstrip=True, normalized=False),
        AddedToken("<cls>", rstrip=True, normalized=False)])
    special.add_tokens([AddedToken("[NOTE]", normalized=True)])
    out = {"gpt2": json.dumps(gpt2), "llama3": json.dumps(llama), "special": special.to_str()}
    # Split variants (run on a KJV excerpt): empty matches, String patterns, Removed, anchors,
    # look-around and \b (Unicode under PCRE2_UCP), case-insensitive groups, nested Sequences.
    level = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
             "use_regex": True}
    plain = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}
    split = lambda p, how, kind="Regex": {"type": "Split", "pattern": {kind: p},
                                          "behavior": how, "invert": False}
    variants = {
        "digits_empty_isolated": [split(r"\d*", "Isolated"), level],
        "digits_empty_removed": [split(r"\d*", "Removed"), plain],
        "string_space_removed": [split(" ", "Removed", "String"), level],
        "string_the_isolated": [split("the", "Isolated", "String"), plain],
        "anchors": [split(r"^\s*|$", "Isolated"), level],
        "lookaround_word_boundary": [split(r"(?<=\p{L})(?=\p{N})|\b", "Isolated"), plain],
        "case_insensitive": [split(r"(?i)lord|god", "Isolated"), level],
        "nested_sequence": [{"type": "Sequence", "pretokenizers": [split(r"\n", "Removed")]},
                            split(r"[,.;:]", "Isolated"), level],
    }
    for name, steps in variants.items():
        v = json.loads(base.to_str())
        v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": steps}
        out["split_" + name] = json.dumps(v)
    return out


def first_difference(ours, theirs, lib: Tokenizer) -> str:
    i = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b),
             min(len(ours), len(theirs)))
    lo = max(0, i - 5)
    show = lambda ids: [lib.id_to_token(t) for t in ids[lo:i + 5]]
    return (f"first difference at token {i} (ours {len(ours)} tokens, library {len(theirs)}):\n"
            f"  ours:    {ours[lo:i + 5]} {show(ours)}\n"
            f"  library: {theirs[lo:i + 5]} {show(theirs)}")


def main() -> int:
    tmp = tempfile.mkdtemp(prefix="hf_parity_")
    try:
        kjv_bytes = kjv()
        corpus = texts(kjv_bytes)
        failures = 0
        for name, text in configs(train(kjv_bytes), set(kjv_bytes.decode().split())).items():
            path = os.path.join(tmp, f"{name}.json")
            with open(path, "w") as f:
                f.write(text)
            lib = Tokenizer.from_file(path)
            for tname, raw in corpus.items():
                if name.startswith("split_") and tname == "kjv":
                    tname, raw = "kjv_excerpt", raw[:100000]
                tpath = os.path.join(tmp, f"{tname}.txt")
                with open(tpath, "wb") as f:
                    f.write(raw)
                run = subprocess.run([TOOL, path, tpath], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
                if run.returncode != 0:
                    print(f"FAIL {name}/{tname}: tool exited {run.returncode}: "
                          f"{run.stderr.decode(errors='replace')}")
                    failures += 1
                    continue
                ours = [int(t) for t in run.stdout.split()]
                replaced = raw.decode("utf-8", "replace")
                theirs = lib.encode(replaced, add_special_tokens=False).ids
                if ours != theirs:
                    print(f"FAIL {name}/{tname}: " + first_difference(ours, theirs, lib))
                    failures += 1
                    continue
                ipath = os.path.join(tmp, "ids.txt")
                with open(ipath, "w") as f:
                    f.write(" ".join(map(str, ours)))
                back = subprocess.run([TOOL, path, ipath, "--decode"], stdout=subprocess.PIPE,
                                      check=True).stdout
                # With add_prefix_space the library's decode keeps the spaces it added; ours
                # must equal it, and give the text back exactly when no space is added.
                if back.decode("utf-8", "replace") != lib.decode(theirs, skip_special_tokens=False):
                    print(f"FAIL {name}/{tname}: decode differs from the library's")
                    failures += 1
                    continue
                if name in ("llama3", "split_string_the_isolated",
                            "split_lookaround_word_boundary") and back != replaced.encode():
                    print(f"FAIL {name}/{tname}: decode does not give the text back")
                    failures += 1
                    continue
                print(f"ok   {name}/{tname}: {len(ours)} tokens")
        if failures:
            print(f"hf_parity: {failures} failure(s)")
            return 1
        print("hf_parity: all equal")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
