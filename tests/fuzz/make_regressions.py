#!/usr/bin/env python3
"""Writes the hand-made inputs of tests/fuzz/regressions/: one per class of bad input the outside
probe reported (issue 22), each refused at its cause now. Reproducers a fuzzer finds are copied
in beside them as they are (crash-<sha1>). Run from the repository root."""
import json, os, struct, sys
sys.path.insert(0, os.path.dirname(__file__))
ROOT = os.path.join("tests", "fuzz", "regressions")

def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

def st(header):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h
put("safetensors", "deep_nesting", st(b"[" * 200000))  # recursive JSON parser: stack overflow
put("safetensors", "header_length_10GB", struct.pack("<Q", 10 << 30) + b"{}")
put("safetensors", "shape_2_80", st({"t": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 0]}}))
put("safetensors", "negative_shape", st({"t": {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 0]}}))
put("safetensors", "no_shape", st({"t": {"dtype": "F32", "data_offsets": [0, 0]}}))
put("safetensors", "offsets_not_numbers", st({"t": {"dtype": "F32", "shape": [1], "data_offsets": ["a", {}]}}))
put("safetensors", "bad_embedded_config", st({"__metadata__": {"format": "modtrain-weights-1", "step": "1",
                                                              "config": "train { log_every: 0 }"}}))
# Issue 43: std::regex in weights_step recursed per character (40,000 spaces or 30,000 digits
# overflowed the stack); tensors not tiling the data section; model sizes of 2^31.
weights_meta = {"format": "modtrain-weights-1", "step": "7", "config": ""}
def spaced(run):
    h = json.dumps({"__metadata__": weights_meta}).encode().replace(b'"step":', b'"step"' + run + b":")
    return struct.pack("<Q", len(h)) + h
put("safetensors", "long_run_of_spaces", spaced(b" " * 50000))
put("safetensors", "long_step_digits", st({"__metadata__": dict(weights_meta, step="1" * 40000)}))
two = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
       "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}
padded = json.dumps(two).encode() + b"    "
put("safetensors", "header_length_one_short", struct.pack("<Q", len(padded) - 1) + padded + b"\0" * 8)
put("safetensors", "bytes_inserted", st(two) + b"\0" * 4 + b"\0" * 8)
put("safetensors", "bytes_appended", st(two) + b"\0" * 8 + b"\0")
put("safetensors", "config_2_31_layers", st({"__metadata__": dict(weights_meta, config="model { n_layers: 2147483647 }")}))
put("safetensors", "config_1000_layers_no_tensors",
    st({"__metadata__": dict(weights_meta, config="model { n_layers: 1000 d_model: 4096 n_heads: 32 d_ff: 16384 }")}))
for field in ["n_layers", "seq_len", "vocab_size", "d_ff"]:
    put("config", field + "_2_31", "model { %s: 2147483647 }\n" % field)
put("config", "predictor_hidden_2_31", "model { mod { causal { predictor_hidden: 2147483647 } } }\n")
put("config", "n_experts_2_31", "model { moe { enabled: true n_experts: 2147483647 } }\n")
put("config", "parameters_2_45", "model { d_model: 65536 n_layers: 1024 d_ff: 262144 }\n")
for text, name in [("optimizer { lr: 1e308 }", "lr_1e308"), ("optimizer { weight_decay: 1e308 }", "weight_decay_1e308"),
                   ("model { init_std: 1e308 }", "init_std_1e308"), ("model { rope_theta: 1e-320 }", "rope_theta_1e-320")]:
    put("config", name, text + "\n")

head = "modtrain-tokenizer 1\nkind bpe\n"
put("tokenizer", "merges_2_60", head + "vocab_size 1152921504606847232\nmerges 1152921504606846976\n")
put("tokenizer", "three_numbers_on_a_line", head + "vocab_size 258\nmerges 2\n104 101 7\n256 108\n")
put("tokenizer", "negative_merge", head + "vocab_size 257\nmerges 1\n-1 104\n")
put("tokenizer", "not_a_number", head + "vocab_size x\nmerges 0\n")
put("hf_tokenizer", "id_4e9", json.dumps({"model": {"type": "BPE", "vocab": {"a": 4000000000}, "merges": []}}))
put("hf_tokenizer", "deep_nesting", "[" * 100000)
# Issue 43. The 50,000-deep Sequence is built in tests/train/data/tokenizer_limits_test.cpp.
bpe_model = {"type": "BPE", "vocab": {"a": 0}, "merges": []}
put("hf_tokenizer", "sequence_nested_3000", '{"model": %s, "pre_tokenizer": %s{"type": "ByteLevel"}%s}' % (
    json.dumps(bpe_model), '{"type": "Sequence", "pretokenizers": [' * 3000, "]}" * 3000))
put("hf_tokenizer", "empty_sequence",  # crashed at the first encode
    json.dumps({"model": bpe_model, "pre_tokenizer": {"type": "Sequence", "pretokenizers": []}}))
put("hf_tokenizer", "sequence_100_steps", json.dumps({"model": bpe_model, "pre_tokenizer": {
    "type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": "x"}, "behavior": "Isolated"}] * 100
    + [{"type": "ByteLevel"}]}}))
put("hf_tokenizer", "regex_match_limit", json.dumps({"model": bpe_model, "runs": "x" * 40, "pre_tokenizer": {
    "type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(x|x)*(?=z)"}, "behavior": "Isolated"},
                                          {"type": "ByteLevel"}]}}))
put("tokenizer", "doubling_merges_40", head + "vocab_size 296\nmerges 40\n97 97\n"
    + "".join("%d %d\n" % (255 + k, 255 + k) for k in range(1, 40)))
put("config", "log_every_zero", "train { log_every: 0 }\n")
put("config", "nan_lr", "optimizer { lr: nan }\n")
put("config", "inf_capacity", "model { mod { capacity: inf } }\n")
put("config", "bucket_zero", "parallel { bucket_mb: 0 }\n")
put("config", "dp_tp_overflow", "parallel { dp: 65536 tp: 65536 }\ntrain { cuda_graph: true device: CUDA }\n")
put("grid_spec", "ranks_overflow", 'name: "g" budgets: [1e12] base { parallel { dp: 65536 tp: 65536 } }\n'
    'shapes { name: "s" d_model: 64 n_layers: 2 n_heads: 2 d_ff: 128 } variants { name: "d" }\n'
    'slurm { ntasks: 1 }\n')
put("token_shard", "count_2_60", bytes([3]) + b"MODTOKS1" + struct.pack("<IIIIQ", 1, 2, 256, 0, 1 << 60))
put("token_shard", "width4_small_vocab", bytes([3]) + b"MODTOKS1" + struct.pack("<IIIIQ", 1, 4, 256, 0, 1) + b"\0" * 4)
put("token_shard", "llmc_reserved", bytes([4]) + struct.pack("<3i", 20240520, 1, 0) + b"\1" * (253 * 4))

import make_seeds as seeds  # rewrites the seeds too (same bytes)
good = seeds.meta(10, 10)
i = good.index(seeds.field(3, 0, 10))
put("checkpoint_meta", "flipped_step", good[:i + 1] + bytes([good[i + 1] ^ 1]) + good[i + 2:])
huge = seeds.field(1, 2, b"t") + seeds.field(2, 2, b"f32") + seeds.field(3, 2, seeds.packed([1 << 62, 1 << 62]))
put("checkpoint_meta", "shape_2_124", seeds.field(1, 0, 1) + seeds.field(10, 2, huge))
piece = (seeds.field(1, 2, b"shard_0.bin") + seeds.field(2, 0, (1 << 64) - 1) + seeds.field(4, 2, seeds.packed([4]))
         + seeds.field(5, 0, (1 << 64) - 8) + seeds.field(6, 0, 16))
shard = b"MODSHARD" + struct.pack("<IIQ", 1, 0, 1) + b"\0" * 40 + b"\0" * 16
put("checkpoint_shard", "offset_wraps", struct.pack("<H", len(piece)) + b"\0" + piece + shard)
put("checkpoint_shard", "pieces_2_60", struct.pack("<H", 0) + b"\0" + b"MODSHARD" + struct.pack("<IIQ", 1, 0, 1 << 60) + b"\0" * 40)
rec = seeds.record(seeds.event(1, "loss", 1.0))
bad = bytearray(rec)
bad[14] ^= 0x20
put("tb_events", "corrupt_middle_record", b"\0" + rec + bytes(bad) + rec)
put("metrics_csv", "negative_step", b"\0step,loss\n-5,1.0\n")
put("metrics_csv", "step_overflow", b"\0step,loss\n99999999999999999999,1.0\n")

# Issue 43: labels and a time limit of 100,000 characters (std::regex overflowed its stack from
# about 30,000); a grid name that long names no directory.
tiny_grid = open("tests/grid/tiny_grid.textproto").read()
put("grid_spec", "long_shape_name", tiny_grid.replace('name: "s1"', 'name: "' + "a" * 100000 + '"'))
put("grid_spec", "long_variant_name", tiny_grid.replace('name: "dense"', 'name: "' + "d" * 100000 + '"'))
put("grid_spec", "long_time_limit", tiny_grid.replace('time_limit: "00:10:00"', 'time_limit: "' + "1" * 100000 + '"'))
put("grid_spec", "long_grid_name", tiny_grid.replace('name: "tiny"', 'name: "' + "g" * 100000 + '"'))
# prep.state edits that once resumed with exit 0 to a wrong dataset; resealed (byte 0 = 1) as a
# hand edit would be, so the checks behind the seal refuse them.
def state(**kw):
    return b"\1" + seeds.prep_state(seal=False, **kw).encode()
put("prep_state", "input_past_end", state(position="7 0 0 0 00000000"))
put("prep_state", "offset_moved", state(position="0 200 5 5 00000000", documents="5 0 100",
                                        splits=(("0 0 0 5", []), ("0 0 0 0", []))))
put("prep_state", "shard_etc_passwd", state(splits=(("1 0 400 1", ["/etc/passwd 400 0"]), ("0 0 0 0", []))))
put("prep_state", "shard_line_removed", state(splits=(("2 0 800 2", ["train_000000.bin 400 0"]), ("0 0 0 0", []))))
put("prep_state", "shard_tokens_changed", state(splits=(("1 0 399 1", ["train_000000.bin 399 0"]), ("0 0 0 0", []))))
put("prep_state", "negative_count", state(documents="-1 0 0"))
put("prep_state", "edited_not_resealed", b"\0" + seeds.prep_state().replace("position 0", "position 1").encode())
# A .gz input whose magic byte is damaged: zlib would pass the compressed bytes through as text.
import gzip
damaged = bytearray(gzip.compress(b"a document long enough to be worth compressing\n" * 8, mtime=0))
damaged[1] ^= 0x01
put("text_source", "gzip_damaged_magic", bytes([2, 40]) + bytes(damaged))
