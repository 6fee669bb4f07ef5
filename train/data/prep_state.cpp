// prep.state reading and writing (see prep_state.h).
#include "train/data/prep_state.h"

#include <map>
#include <sstream>
#include <stdexcept>

#include "core/util/file_io.h"

namespace mod::data {

namespace {
constexpr const char* kStateMagic = "modtrain-prep-state 1";

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}
}  // namespace

std::string prep_state_text(const PrepState& s) {
  std::ostringstream o;
  o << kStateMagic << "\n";
  for (const auto& [k, v] : s.fingerprint) o << "option\t" << k << "\t" << v << "\n";
  o << "position " << s.next.input << " " << s.next.offset << " " << s.next.document << " "
    << s.next.line << "\n";
  o << "documents " << s.documents << " " << s.val_documents << " " << s.text_bytes << "\n";
  for (int i = 0; i < 2; ++i) {
    const auto& p = s.split[i];
    o << "split " << i << " " << p.index << " " << p.partial << " " << p.tokens << " "
      << p.documents << "\n";
    for (const auto& d : p.done) o << "shard " << i << " " << d.name << " " << d.tokens << " " << d.crc << "\n";
  }
  o << "end\n";
  return o.str();
}

PrepState read_prep_state(const std::string& path) {
  std::istringstream in(util::read_file(path));
  PrepState s;
  std::string line;
  int line_no = 0;
  bool ended = false;
  auto bad = [&](const std::string& why) {
    fail(path + ":" + std::to_string(line_no), why + " (delete the directory to start over)");
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (line_no == 1) {
      if (line != kStateMagic) bad("not a prep state");
      continue;
    }
    if (line.rfind("option\t", 0) == 0) {
      const size_t tab = line.find('\t', 7);
      if (tab == std::string::npos) bad("bad option line");
      s.fingerprint.emplace_back(line.substr(7, tab - 7), line.substr(tab + 1));
      continue;
    }
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "position") {
      ls >> s.next.input >> s.next.offset >> s.next.document >> s.next.line;
    } else if (key == "documents") {
      ls >> s.documents >> s.val_documents >> s.text_bytes;
    } else if (key == "split") {
      int i = -1;
      ls >> i;
      if (i < 0 || i > 1) bad("bad split");
      ls >> s.split[i].index >> s.split[i].partial >> s.split[i].tokens >> s.split[i].documents;
    } else if (key == "shard") {
      int i = -1;
      ShardRecord r;
      ls >> i >> r.name >> r.tokens >> r.crc;
      if (i < 0 || i > 1) bad("bad shard");
      s.split[i].done.push_back(r);
    } else if (key == "end") {
      ended = true;
    } else {
      bad("unknown line '" + line + "'");
    }
    if (ls.fail()) bad("bad line '" + line + "'");
  }
  if (!ended) bad("truncated");
  return s;
}

std::string fingerprint_change(const Fingerprint& was, const Fingerprint& now) {
  std::map<std::string, std::string> a(was.begin(), was.end()), b(now.begin(), now.end());
  for (const auto& [k, v] : now) {
    const auto it = a.find(k);
    if (it == a.end()) return k + " was not given before, is now " + v;
    if (it->second != v) return k + " was " + it->second + ", is now " + v;
  }
  for (const auto& [k, v] : was)
    if (!b.count(k)) return k + " was " + v + ", is now not given";
  return "";
}

}  // namespace mod::data
