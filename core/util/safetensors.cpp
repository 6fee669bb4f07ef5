// safetensors reader and writer (see safetensors.h); the header is checked by
// safetensors_header.cpp before any tensor is allocated.
#include "core/util/safetensors.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "core/util/atomic_file.h"
#include "core/util/crc32c.h"
#include "core/util/safetensors_header.h"

namespace mod {

namespace {

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

// Once per file and process: grid results evaluate the same files again.
void note_unsealed(const std::string& path) {
  static std::mutex mu;
  static std::set<std::string> noted;
  const std::lock_guard<std::mutex> lock(mu);
  if (noted.insert(path).second)
    std::fprintf(stderr,
                 "note: safetensors %s has no CRC-32C seal (not written by modtrain): "
                 "its tensors load unchecked\n",
                 path.c_str());
}
}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& user_metadata) {
  std::map<std::string, std::string> metadata = user_metadata;
  for (const auto& [key, value] : user_metadata)
    if (key.rfind(kSealKeyPrefix, 0) == 0)
      throw std::invalid_argument("safetensors " + path + ": metadata key '" + key +
                                  "' is reserved for the seal");
  for (const auto& [name, t] : tensors) {  // a GPU tensor is copied twice, never held twice
    const Tensor host = t.to(Device::CPU);
    metadata[kSealKeyPrefix + name] = crc32c_text(crc32c(host.raw_data(), host.nbytes()));
  }
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
  util::AtomicFile out(path);
  const uint64_t n = header.size();
  out.write(&n, 8);
  out.write(header);
  for (const auto& [name, t] : tensors) {
    const Tensor host = t.to(Device::CPU);  // the tensor itself when already there
    out.write(host.raw_data(), host.nbytes());
  }
  out.commit();
}

SafetensorsFile load_safetensors(const std::string& path) {
  const SafetensorsIndex index = read_safetensors_index(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("safetensors " + path + ": cannot open");
  if (!index.sealed && !index.tensors.empty()) note_unsealed(path);
  SafetensorsFile out;
  out.metadata = index.metadata;
  for (const SafetensorsEntry& e : index.tensors) {
    Tensor t = Tensor::empty(e.shape, e.dtype);  // its size matches the checked byte range
    in.seekg(static_cast<std::streamoff>(index.data_start + e.begin));
    in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
    if (!in) throw std::runtime_error("safetensors " + path + ": tensor " + e.name + ": read failed");
    check_safetensors_seal(e, t.raw_data(), path);
    out.tensors.emplace(e.name, t);
  }
  return out;
}

}  // namespace mod
