// Shared by the tests that check error messages: the message a call throws, and a file's bytes
// written as given (hostile inputs are built in memory, then read through the real readers).
#pragma once

#include <exception>
#include <fstream>
#include <functional>
#include <string>

namespace mod::test {

// The what() of the exception fn throws, or "no error" when it returns.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace mod::test
