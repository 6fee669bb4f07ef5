// safetensors header parsing and checks (see safetensors_header.h); JSON through
// Boost.PropertyTree, whose recursive parser is shielded by a nesting-depth pre-scan.
#include "core/util/safetensors_header.h"

#include <algorithm>
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "core/util/crc32c.h"
#include "core/util/json_nesting.h"

namespace mod {

namespace {
namespace pt = boost::property_tree;

// A real header nests 3 deep ({name: {shape: [..]}}); the parser recurses once per level, so
// "[[[[..." a megabyte deep would overflow the stack.
constexpr int kMaxDepth = 16;

DType from_st_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::F32;
  if (s == "F64") return DType::F64;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "BF16") return DType::BF16;
  throw std::runtime_error(where + ": dtype '" + s + "' is not supported (F32, F64, I32, I64, BF16)");
}

// A JSON number as an unsigned integer, or an error naming the field: ptree holds it as text.
uint64_t as_count(const pt::ptree& node, const std::string& where) {
  const std::string text = node.get_value<std::string>();
  if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos)
    throw std::runtime_error(where + ": '" + text + "' is not a non-negative integer below 10^19");
  return std::stoull(text);
}
// The reference library's rule: in offset order the tensors tile the data section exactly, from
// byte 0 to its end. A gap, an overlap or uncovered bytes mean a shifted header or inserted or
// appended bytes, and every tensor after them would be read from the wrong place.
void check_tiling(const std::vector<SafetensorsEntry>& tensors, uint64_t data_bytes,
                  const std::string& path) {
  std::vector<const SafetensorsEntry*> order;
  for (const SafetensorsEntry& e : tensors) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return std::make_pair(a->begin, a->end) < std::make_pair(b->begin, b->end);
  });
  uint64_t at = 0;
  for (const SafetensorsEntry* e : order) {
    if (e->begin != at)
      throw std::runtime_error("safetensors " + path + ": tensor '" + e->name +
                               "': data_offsets start at byte " + std::to_string(e->begin) +
                               " where the previous tensor ends at " + std::to_string(at) +
                               (e->begin > at ? " (a gap)" : " (an overlap)"));
    at = e->end;
  }
  if (at != data_bytes)
    throw std::runtime_error(
        "safetensors " + path + ": " +
        (order.empty() ? "no tensors" : "the last tensor '" + order.back()->name + "'") +
        " ends at byte " + std::to_string(at) + " of the " + std::to_string(data_bytes) +
        " data bytes: file not fully covered (a wrong header length, or bytes inserted or appended)");
}

// Moves the seal's keys out of the metadata onto the entries. A seal without its tensor, or a
// tensor without its seal in a sealed file, is an error naming it.
void take_seal(SafetensorsIndex& index, const std::string& path) {
  const std::string prefix = kSealKeyPrefix;
  std::map<std::string, uint32_t> seals;
  for (auto it = index.metadata.begin(); it != index.metadata.end();) {
    if (it->first.rfind(prefix, 0) != 0) {
      ++it;
      continue;
    }
    seals[it->first.substr(prefix.size())] =
        parse_crc32c_text(it->second, "safetensors " + path + ": metadata " + it->first);
    it = index.metadata.erase(it);
  }
  if (seals.empty()) return;
  for (SafetensorsEntry& e : index.tensors) {
    const auto s = seals.find(e.name);
    if (s == seals.end())
      throw std::runtime_error("safetensors " + path + ": tensor '" + e.name +
                               "' has no seal (metadata " + prefix + e.name +
                               ") although the file is sealed");
    e.crc32c = s->second;
    seals.erase(s);
  }
  if (!seals.empty())
    throw std::runtime_error("safetensors " + path + ": the seal names tensor '" +
                             seals.begin()->first + "', which the file does not hold");
  index.sealed = true;
}
}  // namespace

void check_safetensors_seal(const SafetensorsEntry& e, const void* data, const std::string& path) {
  if (!e.crc32c) return;
  const uint32_t crc = crc32c(data, e.end - e.begin);
  if (crc != *e.crc32c)
    throw std::runtime_error("safetensors " + path + ": tensor '" + e.name +
                             "': its data has CRC-32C " + crc32c_text(crc) + ", its seal says " +
                             crc32c_text(*e.crc32c) +
                             " (the file was damaged after it was written)");
}

uint64_t safetensors_header_length(const unsigned char first8[8], uint64_t file_bytes,
                                   const std::string& path) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | first8[i];  // little-endian
  if (file_bytes < 8 || n > file_bytes - 8)
    throw std::runtime_error("safetensors " + path + ": header length " + std::to_string(n) +
                             " does not fit the file of " + std::to_string(file_bytes) + " bytes");
  return n;
}

SafetensorsIndex parse_safetensors_header(const std::string& header_json, uint64_t file_bytes,
                                          const std::string& path) {
  SafetensorsIndex out;
  out.data_start = 8 + header_json.size();
  if (out.data_start > file_bytes)
    throw std::runtime_error("safetensors " + path + ": header of " +
                             std::to_string(header_json.size()) + " bytes does not fit the file");
  const uint64_t data_bytes = file_bytes - out.data_start;
  check_json_nesting(header_json, kMaxDepth, "safetensors " + path + ": JSON header");
  pt::ptree root;
  try {
    std::istringstream hs(header_json);
    pt::read_json(hs, root);
  } catch (const pt::json_parser_error& e) {
    throw std::runtime_error("safetensors " + path + ": bad JSON header: " + e.what());
  }
  std::set<std::string> seen;
  for (const auto& [name, node] : root) {
    const std::string where = "safetensors " + path + ": tensor '" + name + "'";
    if (name.empty())
      throw std::runtime_error("safetensors " + path + ": the header is not a JSON object");
    if (!seen.insert(name).second) throw std::runtime_error(where + ": listed twice");
    if (name == "__metadata__") {
      for (const auto& [k, v] : node) {
        if (!v.empty()) throw std::runtime_error(where + ": value of '" + k + "' is not a string");
        out.metadata[k] = v.get_value<std::string>();
      }
      continue;
    }
    SafetensorsEntry e;
    e.name = name;
    const auto dtype = node.get_child_optional("dtype");
    if (!dtype || !dtype->empty()) throw std::runtime_error(where + ": no dtype string");
    e.dtype = from_st_dtype(dtype->get_value<std::string>(), where);
    const auto shape = node.get_child_optional("shape");
    const auto offsets = node.get_child_optional("data_offsets");
    if (!shape || !offsets) throw std::runtime_error(where + ": needs shape and data_offsets");
    for (const auto& [k, d] : *shape) {
      const uint64_t v = as_count(d, where + ": shape");
      if (!k.empty() || v > uint64_t{1} << 62) throw std::runtime_error(where + ": bad shape");
      e.shape.push_back(static_cast<int64_t>(v));
    }
    std::vector<uint64_t> off;
    for (const auto& [k, o] : *offsets) {
      if (!k.empty()) throw std::runtime_error(where + ": data_offsets is not a list");
      off.push_back(as_count(o, where + ": data_offsets"));
    }
    if (off.size() != 2 || off[1] < off[0] || off[1] > data_bytes)
      throw std::runtime_error(where + ": data_offsets outside the " + std::to_string(data_bytes) +
                               " data bytes (truncated file?)");
    e.begin = off[0];
    e.end = off[1];
    int64_t numel = 0;
    try {
      numel = shape_numel(e.shape);
    } catch (const std::invalid_argument& err) {
      throw std::runtime_error(where + ": " + err.what());
    }
    // numel <= data bytes here, so the product fits in 64 bits.
    if (static_cast<uint64_t>(numel) > data_bytes ||
        static_cast<uint64_t>(numel) * dtype_size(e.dtype) != e.end - e.begin)
      throw std::runtime_error(where + ": " + std::to_string(e.end - e.begin) + " bytes for shape " +
                               shape_str(e.shape) + " of " + dtype_name(e.dtype));
    out.tensors.push_back(std::move(e));
  }
  check_tiling(out.tensors, data_bytes, path);
  take_seal(out, path);
  return out;
}

SafetensorsIndex read_safetensors_index(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("safetensors " + path + ": cannot open");
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) throw std::runtime_error("safetensors " + path + ": cannot stat: " + ec.message());
  unsigned char first8[8] = {};
  in.read(reinterpret_cast<char*>(first8), 8);
  // Checked against the file size before the header is allocated.
  const uint64_t n = safetensors_header_length(first8, in ? file_size : 0, path);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  if (!in) throw std::runtime_error("safetensors " + path + ": header read failed");
  return parse_safetensors_header(header, file_size, path);
}

}  // namespace mod
