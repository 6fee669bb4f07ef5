#!/usr/bin/env python3
"""Writes the seeds of tests/fuzz/corpus/: configs and grid specs copied from configs/, the binary
formats built byte by byte as the writers lay them out (checkpoint metadata sealed with its
CRC-32C as seal_meta does). Run from the repository root after changing a format."""
import json, os, shutil, struct, glob

ROOT = os.path.join("tests", "fuzz", "corpus")

def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

# CRC-32C (Castagnoli) and TFRecord's mask, as core/util/crc32c.h.
_T = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    _T.append(c)
def crc32c(b, crc=0):
    crc ^= 0xFFFFFFFF
    for x in b:
        crc = _T[(crc ^ x) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
def masked(c):
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF

def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])
def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    if wire == 1:
        return key + struct.pack("<d", payload)
    if wire == 5:
        return key + struct.pack("<f", payload)
    return key + varint(len(payload)) + payload

for p in glob.glob("configs/recipes/*.textproto"):
    os.makedirs(os.path.join(ROOT, "config"), exist_ok=True)
    shutil.copy(p, os.path.join(ROOT, "config"))
# Dataset manifests as modtrain prep writes them, and one over llm.c shards indexed in place.
put("dataset_manifest", "prep_kjv.textproto", """version: 1
vocab_size: 256
tokenizer: "tokenizer.txt"
train {
  path: "train_000000.bin"
  tokens: 4101516
  crc32c: 2961542731
}
val {
  path: "val_000000.bin"
  tokens: 196727
  crc32c: 1370329003
}
prep {
  inputs: "kjv"
  tokenizer: "byte"
  shard_tokens: 100000000
  val_fraction: 0.005
  documents: 66
  text_bytes: 4298285
  seed: 1234
}
""")
put("dataset_manifest", "fineweb_llmc.textproto", """version: 1
vocab_size: 50257
tokenizer: "tokenizer.json"
eot_token: 50256
train { path: "/data/fineweb/fineweb_train_000001.bin" format: LLMC tokens: 100000000 crc32c: 1 }
train { path: "/data/fineweb/fineweb_train_000002.bin" format: LLMC tokens: 100000000 }
val { path: "/data/fineweb/fineweb_val_000000.bin" format: LLMC tokens: 100000000 }
""")
for p in glob.glob("configs/grids/*.textproto"):
    os.makedirs(os.path.join(ROOT, "grid_spec"), exist_ok=True)
    shutil.copy(p, os.path.join(ROOT, "grid_spec"))

put("tokenizer", "byte.tokenizer", "modtrain-tokenizer 1\nkind byte\nvocab_size 256\nmerges 0\n")
put("tokenizer", "bpe.tokenizer",
    "modtrain-tokenizer 1\nkind bpe\nvocab_size 261\nmerges 5\n104 101\n116 256\n32 257\n108 108\n259 111\n")

vocab = {}
for b in range(256):
    vocab[chr(b) if 33 <= b <= 126 else chr(0x100 + b)] = b
vocab.update({"\u0120t": 256, "he": 257, "\u0120the": 258})
hf = {"version": "1.0", "truncation": None, "padding": None,
      "added_tokens": [{"id": 259, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                        "rstrip": False, "normalized": False, "special": True}],
      "normalizer": None,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
      "post_processor": None,
      "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
      "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                "ignore_merges": False, "vocab": vocab, "merges": ["\u0120 t", "h e", "\u0120t he"]}}
put("hf_tokenizer", "gpt2_small.json", json.dumps(hf))
# Nesting depth: the ByteLevel step inside Sequences 8 deep (the reader allows 32).
nested = dict(hf)
for _ in range(8):
    nested["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [nested["pre_tokenizer"]]}
put("hf_tokenizer", "nested_sequence.json", json.dumps(nested))
# Llama-3 style: a Split regex, then ByteLevel without its own.
llama = dict(hf)
llama["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                  "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
# Merges as pairs (the other form; a file holds one form only, as the library requires). Long
# runs in a vocabulary token (an unknown field would be refused), which the entry encodes as
# text with the rest of the input; the added token moves to the next id.
runs = "a" * 6000 + "\u0120" * 3000 + "7" * 3000 + "\u010a" * 1000 + "!?" * 1000
llama["model"] = dict(hf["model"], ignore_merges=True, vocab=dict(vocab, **{runs: 259}),
                      merges=[["\u0120", "t"], ["h", "e"], ["\u0120t", "he"]])
llama["added_tokens"] = [dict(hf["added_tokens"][0], id=260)]
put("hf_tokenizer", "llama3_long_runs.json", json.dumps(llama))
# Long runs for the modtrain BPE: 12 self-doubling merges make a 4096-byte token, the bound.
put("tokenizer", "doubling.tokenizer", "modtrain-tokenizer 1\nkind bpe\nvocab_size 268\nmerges 12\n97 97\n"
    + "".join("%d %d\n" % (255 + k, 255 + k) for k in range(1, 12)))

toks = [1, 2, 3, 255, 0, 17, 42, 7]
# token_shard: byte 0 = format (0 modtrain, 1 llm.c, 2 nanoGPT) + 3 x vocab choice (1: 256).
put("token_shard", "modtrain.bin", bytes([0 + 3 * 1]) + b"MODTOKS1" + struct.pack("<IIIIQ", 1, 2, 256, 0, len(toks))
    + struct.pack("<%dH" % len(toks), *toks))
put("token_shard", "modtrain_u32.bin", bytes([0 + 3 * 4]) + b"MODTOKS1" + struct.pack("<IIIIQ", 1, 4, 70000, 0, 3)
    + struct.pack("<3I", 69999, 0, 5))
put("token_shard", "llmc.bin", bytes([1 + 3 * 1]) + struct.pack("<3i", 20240520, 1, len(toks)) + b"\0" * (253 * 4)
    + struct.pack("<%dH" % len(toks), *toks))
put("token_shard", "nanogpt.bin", bytes([2 + 3 * 1]) + struct.pack("<%dH" % len(toks), *toks))

# safetensors: two tensors and modtrain's metadata.
def safetensors(tensors, meta):
    header, data = {"__metadata__": meta}, b""
    for name, fmt, dtype, shape, values in tensors:
        raw = struct.pack("<%d%s" % (len(values), fmt), *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data
put("safetensors", "weights.safetensors", safetensors(
    [("wte.weight", "f", "F32", [2, 3], [0.5, -1, 2, 3, 4, 5]), ("lm_head.bias", "d", "F64", [2], [1.0, 2.0]),
     ("pos", "q", "I64", [1, 1], [7])],
    {"format": "modtrain-weights-1", "step": "10", "config": "name: \"tiny\" model { d_model: 64 n_heads: 2 }"}))
# A whole model as its config describes it (1 block of width 4), so the header checks run to
# the end; and long runs of spaces and digits where a header allows them (issue 43).
tiny = [("embed.weight", [4, 4])]
tiny += [("blocks.0." + n, s) for n, s in [("norm1.weight", [4]), ("attn.wq.weight", [4, 4]),
         ("attn.wk.weight", [4, 4]), ("attn.wv.weight", [4, 4]), ("attn.wo.weight", [4, 4]),
         ("norm2.weight", [4]), ("mlp.up.weight", [4, 4]), ("mlp.down.weight", [4, 4])]]
tiny += [("final_norm.weight", [4])]
tiny_config = "model { vocab_size: 4 d_model: 4 n_layers: 1 n_heads: 2 d_ff: 4 seq_len: 8 }"
tiny_tensors = [(n, "f", "F32", s, [0.25] * (s[0] * (s[1] if len(s) > 1 else 1))) for n, s in tiny]
put("safetensors", "tiny_model.safetensors", safetensors(tiny_tensors,
    {"format": "modtrain-weights-1", "step": "3", "config": tiny_config}))
# The same model sealed as modtrain writes it: "crc32c.<name>" per tensor (8 lowercase hex digits).
sealed_tensors = [(n, f, d, s, [0.25 + i + k / 8 for k in range(len(v))])
                  for i, (n, f, d, s, v) in enumerate(tiny_tensors)]
seal = {"crc32c." + n: "%08x" % crc32c(struct.pack("<%d%s" % (len(v), f), *v))
        for n, f, d, s, v in sealed_tensors}
put("safetensors", "sealed_tiny_model.safetensors", safetensors(sealed_tensors,
    dict(seal, format="modtrain-weights-1", step="3", config=tiny_config)))
spaced = safetensors(tiny_tensors, {"format": "modtrain-weights-1", "step": "3", "config": tiny_config})
n = struct.unpack("<Q", spaced[:8])[0]
h = spaced[8:8 + n].replace(b'"step":', b'"step"' + b" " * 4096 + b":")
put("safetensors", "long_runs.safetensors", struct.pack("<Q", len(h)) + h + spaced[8 + n:])
put("config", "long_runs.textproto", "model {" + " " * 4096 + "n_layers: " + "0" * 4096 + "6 }\n")

# checkpoint_shard: u16 piece length | dtype byte (0: f32) | Piece | shard file.
payload = struct.pack("<4f", 1, 2, 3, 4)
shard = b"MODSHARD" + struct.pack("<IIQ", 1, 0, 1) + b"\0" * 40 + payload
piece = (field(1, 2, b"shard_0.bin") + field(2, 0, (1 << 64) - 1) + field(4, 2, varint(2) + varint(2))
         + field(5, 0, 64) + field(6, 0, 16) + field(7, 0, crc32c(payload)))
put("checkpoint_shard", "f32_2x2.bin", struct.pack("<H", len(piece)) + b"\0" + piece + shard)

put("metrics_csv", "metrics.csv", b"\x05step,loss,lr,grad_norm\n1,5.5,0.001,1.2\n2,5.1,0.001,\n3,4.9,0.001,0.9\n"
    b"6,4.2,0.0009,0.8\n7,4.1,0.0009,0.7\n8,4.0")

def record(b):
    n = struct.pack("<Q", len(b))
    return n + struct.pack("<I", masked(crc32c(n))) + b + struct.pack("<I", masked(crc32c(b)))
def event(step, tag=None, value=0.0, version=None):
    e = field(1, 1, 1.7e9) + field(2, 0, step)
    if version:
        e += field(3, 2, version.encode())
    if tag:
        v = field(1, 2, tag.encode()) + field(2, 5, value)
        e += field(5, 2, field(1, 2, v))
    return e
events = record(event(0, version="brain.Event:2"))
for s in range(1, 9):
    events += record(event(s, "loss", 5.0 - s * 0.1))
put("tb_events", "events.out.tfevents", b"\x05" + events)
put("tb_events", "torn.tfevents", b"\x05" + events + record(event(9, "loss", 1.0))[:20])

# checkpoint_meta: CheckpointMeta fields in number order (the deterministic serialization),
# then meta_crc32c over those bytes, as metadata.cpp's seal_meta.
def packed(vals):
    return b"".join(varint(v) for v in vals)
def meta(step, opt_steps, sealed=True):
    tensor = (field(1, 2, b"model/wte.weight") + field(2, 2, b"f32") + field(3, 2, packed([2, 2]))
              + field(4, 2, piece))
    body = (field(1, 0, 1) + field(2, 2, field(1, 2, b"tiny")) + field(3, 0, step) + field(4, 0, step * 512)
            + field(5, 2, field(1, 0, 1337) + field(2, 0, step)) + field(6, 2, packed([12345, 678]))
            + field(7, 2, field(1, 0, 1) + field(2, 0, 1) + field(4, 0, 1))
            + field(8, 2, field(1, 1, 12.5) + field(2, 0, step)) + field(9, 0, opt_steps)
            + field(10, 2, tensor))
    return body + (field(11, 0, crc32c(body)) if sealed else b"")
put("checkpoint_meta", "step10.pb", meta(10, 10))
put("checkpoint_meta", "unsealed_old.pb", meta(10, 10, sealed=False))

# prep.state as train/data/prep_state.cpp writes it: the lines, then a crc32c line sealing them.
# Byte 0 of a prep_state input: odd = reseal the rest first (fuzz_one_prep_state).
def prep_state(position="0 0 0 0 00000000", documents="0 0 0", splits=(("0 0 0 0", []), ("0 0 0 0", [])),
               seal=True):
    body = ("modtrain-prep-state 2\noption\tinput 0\tcorpus.jsonl (5000 bytes)\noption\t--shard-tokens\t400\n"
            "position " + position + "\ndocuments " + documents + "\n")
    for i, (split, shards) in enumerate(splits):
        body += "split %d %s\n" % (i, split)
        body += "".join("shard %d %s\n" % (i, s) for s in shards)
    body += "end\n"
    return body + ("crc32c %08x\n" % crc32c(body.encode()) if seal else "")
put("prep_state", "fresh.state", b"\0" + prep_state().encode())
put("prep_state", "two_shards.state", b"\0" + prep_state(
    "0 120 4 4 1c2d3e4f", "4 1 900", (("2 17 817 3", ["train_000000.bin 400 3735928559", "train_000001.bin 400 1"]),
                                      ("1 3 403 1", ["val_000000.bin 400 7"]))).encode())
put("prep_state", "resealed_body.state", b"\1" + prep_state(seal=False).encode())

# Inputs of prep: byte 0 the kind (bit 0 JSON Lines, bit 1 gzip), byte 1 the chunk size - 1.
import gzip
text = "In the beginning God created the heaven and the earth.\nAnd the earth was without form.\n" * 4
jsonl = "".join(json.dumps({"text": line, "id": i}) + "\n" for i, line in enumerate(text.splitlines()))
put("text_source", "plain.txt", bytes([0, 40]) + text.encode())
put("text_source", "lines.jsonl", bytes([1, 3]) + jsonl.encode() + b"\n  \n")
put("text_source", "plain.txt.gz", bytes([2, 63]) + gzip.compress(text.encode(), mtime=0))
put("text_source", "lines.jsonl.gz", bytes([3, 0]) + gzip.compress(jsonl.encode(), mtime=0))

# A grid spec with long labels (a million-character one once overflowed std::regex's stack).
with open("tests/grid/tiny_grid.textproto") as f:
    tiny_grid = f.read()
put("grid_spec", "long_labels.textproto", tiny_grid.replace('name: "s1"', 'name: "' + "s" * 64 + '"')
    .replace('name: "dense"', 'name: "' + "d" * 20000 + '"'))
