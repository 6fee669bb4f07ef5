#!/usr/bin/env python3
"""Writes tests/fuzz/dict/<target>.dict: the formats' keywords (for text formats, every field
and enum name of the schema) in libFuzzer's dictionary syntax. Run from the repository root."""
import os, re

def fields(proto):
    s = open(proto).read()
    names = set(re.findall(r'^\s*(?:optional|repeated|required)?\s*[\w.]+\s+(\w+)\s*=\s*\d+', s, re.M))
    enums = set(re.findall(r'^\s*([A-Z][A-Z0-9_]+)\s*=\s*\d+;', s, re.M))
    return names | enums

def esc(w):
    out = ""
    for b in w.encode("latin-1"):  # str of byte values: the magic is binary
        c = chr(b)
        out += c if 32 <= b < 127 and c not in '"\\' else "\\x%02x" % b
    return out

def write(name, words, what):
    os.makedirs("tests/fuzz/dict", exist_ok=True)
    with open("tests/fuzz/dict/%s.dict" % name, "w") as f:
        f.write("# libFuzzer dictionary for the %s reader: %s (tests/fuzz/make_dicts.py).\n" % (name, what))
        for i, w in enumerate(sorted(words)):
            f.write('kw%d="%s"\n' % (i, esc(w)))

punct = ['{', '}', ':', ' ', '\n', '"', '[', ']', ',', '#', 'nan', 'inf', '-inf', '1e308', '-1', '0',
         '2147483647', '-2147483648', '9223372036854775807', 'true', 'false', '0x7fffffff', '1e-320']
cfg = fields("configs/modtrain.proto")
write("config", cfg | set(punct), "RunConfig fields and enums, extreme numbers")
write("grid_spec", cfg | fields("configs/grid.proto") | set(punct), "GridSpec and RunConfig fields")
write("tokenizer", {"modtrain-tokenizer", "kind", "byte", "bpe", "vocab_size", "merges", "\n", " ", "1",
                    "256", "0", "4294967295", "18446744073709551615", "-1", "\r\n"}, "keys and numbers")
write("hf_tokenizer", {'"version"', '"added_tokens"', '"normalizer"', '"pre_tokenizer"', '"decoder"',
                       '"model"', '"type"', '"BPE"', '"ByteLevel"', '"Split"', '"Sequence"', '"NFC"',
                       '"NFKC"', '"Lowercase"', '"Replace"', '"pattern"', '"Regex"', '"String"',
                       '"behavior"', '"Isolated"', '"vocab"', '"merges"', '"content"', '"id"',
                       '"special"', '"lstrip"', '"rstrip"', '"single_word"', '"normalized"',
                       '"add_prefix_space"', '"use_regex"', '"ignore_merges"', '"byte_fallback"',
                       '"unk_token"', '"continuing_subword_prefix"', '"end_of_word_suffix"',
                       '"pretokenizers"', '"normalizers"', 'null', 'true', 'false', '{', '}', '[', ']',
                       ':', ',', '(?', '\\p{L}', '\\u0120', '<|endoftext|>', '4294967294'}, "JSON keys and values")
write("safetensors", {'"__metadata__"', '"dtype"', '"shape"', '"data_offsets"', '"F32"', '"F64"', '"I32"',
                      '"I64"', '"BF16"', '"F16"', '"format"', '"modtrain-weights-1"', '"step"', '"config"',
                      '{', '}', '[', ']', ':', ',', '18446744073709551615', '9223372036854775807', '-1',
                      '1e20'}, "header keys and dtypes")
write("metrics_csv", {"step,loss", "\n", ",", "-1", "9223372036854775808", "nan", "inf", "1e400", " "},
      "separators and numbers")
write("token_shard", {"MODTOKS1", "\x88\xd8\x34\x01",
                      "\x01\x00\x00\x00", "\x02\x00\x00\x00", "\x04\x00\x00\x00"}, "magics and header values")
write("checkpoint_shard", {"MODSHARD", "\x01\x00\x00\x00", "shard_0.bin"}, "magic and names")
write("dataset_manifest", fields("train/data/dataset.proto") | set(punct) | {"train_000000.bin", "/", ".."},
      "Manifest fields and enums, extreme numbers")
write("checkpoint_meta", {"f32", "f64", "i32", "i64", "bf16", "model/wte.weight", "shard_0.bin", "optim/m/"},
      "dtypes and names")
