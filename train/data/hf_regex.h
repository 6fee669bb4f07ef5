// tokenizer.json's regexes (internal to train/data/hf_*.cpp): Oniguruma patterns, as the
// `tokenizers` library compiles them, run by PCRE2 (JIT where it compiles) under Oniguruma's
// match limit, with errors that name the file and the field the pattern came from.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "train/data/hf_json.h"
#include "train/data/unicode.h"

namespace mod::data::hf {

// PCRE2's limits on one match: Oniguruma's default retry limit (the library's engine), and a
// JIT stack that patterns with nested repeats need on 64 KiB pieces (PCRE2's default is 32 KiB).
constexpr uint32_t kMatchLimit = 10'000'000;
constexpr size_t kJitStackBytes = 4 << 20;

// The per-thread part of matching: the JIT stack and the match context that carries it and the
// limits; one serves every regex of a thread (a match returns before its callback runs).
struct MatchScratch {
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 << 10, kJitStackBytes, nullptr);
  MatchScratch() {
    if (!context || !jit_stack) {
      pcre2_jit_stack_free(jit_stack);
      pcre2_match_context_free(context);
      throw std::bad_alloc();
    }
    pcre2_set_match_limit(context, kMatchLimit);
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

// A compiled PCRE2 pattern; matching is read-only, so one instance serves every thread. Errors
// name the file and the field the pattern came from.
class Regex {
 public:
  // Compiles `pattern` (Oniguruma syntax, as the library reads it) and runs a trial match on a
  // sample text, so a pattern that cannot run is refused at load, naming file and field.
  Regex(const std::string& pattern, const Json& j, const std::string& path);
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(start, end) for each match, in order, as the onig crate's find_iter does: an empty
  // match right where the previous match ended is skipped by stepping one character.
  template <class F>
  void find_iter(std::string_view s, pcre2_match_data* md, MatchScratch& scratch, F&& f) const {
    size_t last_end = 0;
    size_t last_match_end = SIZE_MAX;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    while (last_end <= s.size()) {
      const int rc =
          jit_ ? pcre2_jit_match(code_.get(), subject, s.size(), last_end, 0, md, scratch.context)
               : pcre2_match(code_.get(), subject, s.size(), last_end, PCRE2_NO_UTF_CHECK, md,
                             scratch.context);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0)
        throw std::runtime_error(where_ + ": the regex failed on a piece of " +
                                 std::to_string(s.size()) + " bytes at byte " +
                                 std::to_string(last_end) + ": PCRE2 error " + std::to_string(rc) +
                                 " (" + error_text(rc) + ")");
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t st = ov[0], en = ov[1];
      if (st == en && last_match_end == en) {
        size_t len = 1;
        if (last_end < s.size()) decode_char(s, last_end, &len);
        last_end += len;
        continue;
      }
      last_end = last_match_end = en;
      f(st, en);
    }
  }

 private:
  static std::string error_text(int code);

  std::string where_;  // "<file>: <field>"
  std::unique_ptr<pcre2_code, void (*)(pcre2_code*)> code_{nullptr, pcre2_code_free};
  bool jit_ = false;
};

}  // namespace mod::data::hf
