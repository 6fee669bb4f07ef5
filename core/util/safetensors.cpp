// safetensors reader and writer (see safetensors.h); JSON through Boost.PropertyTree.
#include "core/util/safetensors.h"

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace mod {

namespace {
namespace pt = boost::property_tree;

std::string st_dtype(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::BF16: return "BF16";
  }
  return "?";
}

DType from_st_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::F32;
  if (s == "F64") return DType::F64;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "BF16") return DType::BF16;
  throw std::runtime_error(where + ": dtype " + s + " is not supported (F32, F64, I32, I64, BF16)");
}

// JSON string escaping for names and metadata values.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}
}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::ostringstream json;
  json << "{";
  bool first = true;
  if (!metadata.empty()) {
    json << "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it)
      json << (it == metadata.begin() ? "" : ",") << quote(it->first) << ":" << quote(it->second);
    json << "}";
    first = false;
  }
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    json << (first ? "" : ",") << quote(name) << ":{\"dtype\":\"" << st_dtype(t.dtype())
         << "\",\"shape\":[";
    for (int64_t i = 0; i < t.dim(); ++i) json << (i ? "," : "") << t.shape()[i];
    json << "],\"data_offsets\":[" << offset << "," << offset + t.nbytes() << "]}";
    offset += t.nbytes();
    first = false;
  }
  json << "}";
  std::string header = json.str();
  header.append((8 - header.size() % 8) % 8, ' ');  // align the data to 8 bytes
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("safetensors: cannot open " + tmp + " for writing");
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const auto& [name, t] : tensors) {
      const Tensor host = t.to(Device::CPU);  // the tensor itself when already there
      out.write(static_cast<const char*>(host.raw_data()), static_cast<std::streamsize>(host.nbytes()));
    }
    out.flush();
    if (!out) throw std::runtime_error("safetensors: writing " + tmp + " failed (disk full?)");
  }
  std::filesystem::rename(tmp, path);
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("safetensors " + path + ": cannot open");
  const uint64_t file_size = std::filesystem::file_size(path);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in || n > file_size - 8)
    throw std::runtime_error("safetensors " + path + ": header length " + std::to_string(n) +
                             " does not fit the file of " + std::to_string(file_size) + " bytes");
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  pt::ptree root;
  try {
    std::istringstream hs(header);
    pt::read_json(hs, root);
  } catch (const pt::json_parser_error& e) {
    throw std::runtime_error("safetensors " + path + ": bad JSON header: " + e.what());
  }
  const uint64_t data_start = 8 + n, data_bytes = file_size - data_start;
  SafetensorsFile out;
  for (const auto& [name, node] : root) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : node) out.metadata[k] = v.get_value<std::string>();
      continue;
    }
    const std::string where = "safetensors " + path + ": tensor " + name;
    const DType dtype = from_st_dtype(node.get<std::string>("dtype", "?"), where);
    Shape shape;
    for (const auto& [_, d] : node.get_child("shape")) shape.push_back(d.get_value<int64_t>());
    std::vector<uint64_t> off;
    for (const auto& [_, o] : node.get_child("data_offsets")) off.push_back(o.get_value<uint64_t>());
    if (off.size() != 2 || off[1] < off[0] || off[1] > data_bytes)
      throw std::runtime_error(where + ": data_offsets outside the " + std::to_string(data_bytes) +
                               " data bytes (truncated file?)");
    Tensor t = Tensor::empty(shape, dtype);
    if (off[1] - off[0] != t.nbytes())
      throw std::runtime_error(where + ": " + std::to_string(off[1] - off[0]) + " bytes for shape " +
                               shape_str(shape) + " of " + st_dtype(dtype));
    in.seekg(static_cast<std::streamoff>(data_start + off[0]));
    in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
    if (!in) throw std::runtime_error(where + ": read failed");
    out.tensors.emplace(name, t);
  }
  return out;
}

}  // namespace mod
