// The rendezvous's messages on the wire (internal to parallel/rendezvous*.cpp): a fixed header
// (magic, kind, sequence number, payload length) and a payload of length-prefixed fields.
// Invariant: a reader never trusts a length it has not checked against what remains, so a
// stranger's bytes on the port are an error naming the peer, not a huge allocation; before its
// hello a peer's frame is at most kMaxHello bytes (rendezvous.cpp reads it without recv_frame).
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/tcp_socket.h"

namespace mod::parallel::wire {

enum class Kind : uint32_t { Hello = 1, Welcome = 2, Gather = 3, Result = 4, Abort = 5 };

struct Frame {
  Kind kind;
  uint64_t seq;
  std::string payload;
};

constexpr uint32_t kMagic = 0x52444f4d;                 // "MODR" on little-endian hosts
constexpr uint64_t kMaxPayload = uint64_t{1} << 31;  // control traffic: far below this
// A hello (rank, size, token, host, nonce) is ~100 bytes; anyone may send one, so rank 0 reads
// no more than this from a peer it does not know yet.
constexpr uint64_t kMaxHello = 4096;

// Why `header` cannot start a frame of at most `max_payload` bytes, or "" when it can.
inline std::string header_problem(const uint64_t (&header)[3], uint64_t max_payload) {
  const uint32_t kind = static_cast<uint32_t>(header[0]);
  if ((header[0] >> 32) != kMagic || kind < 1 || kind > 5)
    return "sent bytes that are not a modtrain rendezvous message";
  if (header[2] > max_payload)
    return "claims a " + std::to_string(header[2]) + "-byte message, more than the " +
           std::to_string(max_payload) + " bytes allowed";
  return "";
}

inline void send_frame(tcp::Socket& s, Kind kind, uint64_t seq, const std::string& payload,
                       tcp::Clock::time_point deadline, const char* what) {
  uint64_t header[3] = {(uint64_t{kMagic} << 32) | static_cast<uint32_t>(kind), seq,
                        payload.size()};
  s.send_all(header, sizeof header, deadline, what);
  s.send_all(payload.data(), payload.size(), deadline, what);
}

inline Frame recv_frame(tcp::Socket& s, tcp::Clock::time_point deadline, const char* what) {
  uint64_t header[3];
  s.recv_all(header, sizeof header, deadline, what);
  const std::string problem = header_problem(header, kMaxPayload);
  if (!problem.empty())
    throw std::runtime_error(std::string(what) + ": " + s.peer() + " " + problem);
  Frame f{static_cast<Kind>(static_cast<uint32_t>(header[0])), header[1],
          std::string(header[2], '\0')};
  s.recv_all(f.payload.data(), f.payload.size(), deadline, what);
  return f;
}

// Length-prefixed fields in a payload.
class Writer {
 public:
  Writer& i64(int64_t v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Writer& str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    out_ += s;
    return *this;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const std::string& in, std::string from) : in_(in), from_(std::move(from)) {}
  int64_t i64() {
    need(sizeof(int64_t));
    int64_t v;
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string str() {
    const int64_t n = i64();
    if (n < 0) bad();
    need(static_cast<size_t>(n));
    std::string s = in_.substr(at_, static_cast<size_t>(n));
    at_ += static_cast<size_t>(n);
    return s;
  }

 private:
  void need(size_t n) {
    if (n > in_.size() - at_) bad();
  }
  [[noreturn]] void bad() {
    throw std::runtime_error("rendezvous: a malformed message from " + from_);
  }
  const std::string& in_;
  std::string from_;
  size_t at_ = 0;
};

}  // namespace mod::parallel::wire
