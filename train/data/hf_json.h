// Reading tokenizer.json (internal to train/data/hf_*.cpp): field access whose errors name the
// file and the field ("tokenizer.json: missing field model.merges").
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace mod::data::hf {

using nlohmann::json;

struct Json {
  const std::string& name;
  [[noreturn]] void fail(const std::string& msg) const {
    throw std::runtime_error(name + ": " + msg);
  }
  const json& field(const json& obj, const char* key, const std::string& path) const {
    if (!obj.is_object()) fail(path + " must be an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail("missing field " + (path.empty() ? "" : path + ".") + key);
    return *it;
  }
  std::string str(const json& obj, const char* key, const std::string& path) const {
    const json& v = field(obj, key, path);
    if (!v.is_string()) fail(path + "." + key + " must be a string");
    return v.get<std::string>();
  }
  bool boolean(const json& obj, const char* key, const std::string& path, bool dflt) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) fail(path + "." + key + " must be true or false");
    return it->get<bool>();
  }
  // A string field that must be null, absent, or one of `ok` (empty `ok`: only null/absent).
  void null_or(const json& obj, const char* key, const std::string& path,
               const std::vector<std::string>& ok, const std::string& supported) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return;
    if (it->is_string())
      for (const auto& s : ok)
        if (it->get<std::string>() == s) return;
    fail(path + "." + key + " " + it->dump() + " is not supported (supported: " + supported + ")");
  }
};

}  // namespace mod::data::hf
