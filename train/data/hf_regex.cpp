// tokenizer.json's regexes (see hf_regex.h).
#include "train/data/hf_regex.h"

namespace mod::data::hf {

namespace {

const char* const kWhiteSpaceClass =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// Rewrites \s and \S to Oniguruma's (= Unicode White_Space) set; PCRE2's \s adds U+180E.
std::string onig_compatible(const std::string& p, const Json& j, const std::string& path) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') {
        if (!in_class) out += '[';
        out += kWhiteSpaceClass;
        if (!in_class) out += ']';
      } else if (e == 'S') {
        if (in_class) j.fail(path + ": \\S inside a character class is not supported");
        out += "[^";
        out += kWhiteSpaceClass;
        out += ']';
      } else {
        out += c;
        out += e;
      }
    } else if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is literal
    } else if (c == '[' && in_class && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t end = p.find(":]", i + 2);  // POSIX class such as [:alpha:]
      if (end == std::string::npos) j.fail(path + ": unterminated [: in the pattern");
      out += p.substr(i, end + 2 - i);
      i = end + 1;
    } else {
      if (c == ']' && in_class) in_class = false;
      out += c;
    }
  }
  return out;
}

// A sample for the trial match at load: words, digits, punctuation, whitespace runs, non-ASCII
// and a long run, so a pattern that cannot run (a JIT or limit error) is refused at load.
std::string trial_text() {
  std::string t =
      "Hello, world! It's 1234 \xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 --- \n\n\t  x\r\n";
  for (int i = 0; i < 64; ++i) t += "word 42, ";
  return t + std::string(4096, 'a') + std::string(1024, ' ');
}

}  // namespace

Regex::Regex(const std::string& pattern, const Json& j, const std::string& path)
    : where_(j.name + ": " + path) {
  const std::string p = onig_compatible(pattern, j, path);
  int err = 0;
  PCRE2_SIZE off = 0;
  // MULTILINE: in Oniguruma's Ruby syntax ^ and $ always match at line boundaries.
  code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &off, nullptr));
  if (!code_)
    j.fail(path + ": pattern does not compile at offset " + std::to_string(off) + ": " +
           error_text(err));
  jit_ = pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE) == 0;
  MatchScratch scratch;
  const std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create(1, nullptr), pcre2_match_data_free);
  try {
    find_iter(trial_text(), md.get(), scratch, [](size_t, size_t) {});
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(e.what()) + " (a trial match at load, on a sample text)");
  }
}

std::string Regex::error_text(int code) {
  PCRE2_UCHAR msg[256];
  if (pcre2_get_error_message(code, msg, sizeof msg) < 0) return "unknown error";
  return reinterpret_cast<const char*>(msg);
}

}  // namespace mod::data::hf
