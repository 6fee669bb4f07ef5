// Routing reports (`modtrain inspect`): the CSV's rows and values, the HTML page's marks and
// escaping, token text that is not valid UTF-8, and the PNG drawn by gnuplot.
#include "train/inspect.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/util/find_on_path.h"
#include "core/util/gnuplot.h"

using namespace mod;
namespace fs = std::filesystem;

namespace {
std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

model::RoutingTrace two_blocks() {
  model::RoutingTrace t;
  t.tokens = {7, 8, 9, 10};
  t.capacity = 1;
  model::BlockTrace a;
  a.block = 1;
  a.router_score = {0.5, -1.25, 2.0, 0.0};
  a.decision_prob = {0.6, 0.1, 0.9, 0.4};
  a.top_c = {false, false, true, false};
  a.causal = {true, false, true, false};
  a.agreement = 0.75;
  model::BlockTrace b = a;
  b.block = 3;
  b.router_score = {3.0, 1.0, -2.0, 0.25};
  b.top_c = {true, false, false, false};
  b.causal = {true, false, false, false};
  b.agreement = 1.0;
  t.blocks = {a, b};
  return t;
}
}  // namespace

TEST_CASE("token text that is not UTF-8 is shown byte by byte", "[inspect]") {
  CHECK(train::printable_piece("And") == "And");
  CHECK(train::printable_piece("caf\xc3\xa9") == "caf\xc3\xa9");  // valid two-byte sequence
  CHECK(train::printable_piece("\xe2\x80") == "<0xE2><0x80>");    // a cut three-byte one
  CHECK(train::printable_piece("a\xffz") == "a<0xFF>z");
}

TEST_CASE("a routing report writes the CSV, the HTML page and the heat map", "[inspect]") {
  const fs::path dir =
      fs::temp_directory_path() / ("modtrain_inspect_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::vector<std::string> pieces = {"In", " \"the\"", " <b>", "\xff\n"};
  const auto report = train::write_routing_report(two_blocks(), pieces, "tiny_mod, step 5", dir);

  const std::string csv = read(report.csv);
  std::istringstream lines(csv);
  std::string line;
  std::vector<std::string> rows;
  while (std::getline(lines, line)) rows.push_back(line);
  // Header, 8 rows; the last token's text holds a newline inside its quoted field (2 lines).
  REQUIRE(rows.size() == 11);
  CHECK(rows[0] == "block,position,token,text,router_score,decision_prob,top_c,causal");
  CHECK(rows[1] == "1,0,7,\"In\",0.5,0.600000,0,1");
  CHECK(rows[2] == "1,1,8,\" \"\"the\"\"\",-1.25,0.100000,0,0");
  CHECK(rows[3] == "1,2,9,\" <b>\",2,0.900000,1,1");
  CHECK(rows[4] == "1,3,10,\"<0xFF>");
  CHECK(rows[5] == "\",0,0.400000,0,0");
  CHECK(rows[6] == "3,0,7,\"In\",3,0.600000,1,1");

  const std::string html = read(report.html);
  CHECK(html.find("<title>tiny_mod, step 5</title>") != std::string::npos);
  CHECK(html.find("block 1: top-C 1, causal 2, agreement 75.0%") != std::string::npos);
  CHECK(html.find("block 3: top-C 1, causal 1, agreement 100.0%") != std::string::npos);
  CHECK(html.find("&lt;b&gt;") != std::string::npos);  // token text escaped
  CHECK(html.find(" <b>") == std::string::npos);
  CHECK(html.find("&lt;0xFF&gt;") != std::string::npos);
  // Block 1, token 2: the highest score (red), chosen by both routings (boxed and underlined).
  CHECK(html.find("<span class=\"t c a\" style=\"background:#b40426\" title=\"#2 token 9: r=2, "
                  "p(enter)=0.900\">") != std::string::npos);
  // Token 1: the lowest (blue), chosen by neither.
  CHECK(html.find("<span class=\"t\" style=\"background:#3b4cc0\" title=\"#1 token 8") !=
        std::string::npos);

  CHECK(fs::exists(dir / "routing.gp"));
  if (util::find_on_path("gnuplot").empty()) {
    WARN("gnuplot not on PATH: routing.png not checked (" << report.png_not_drawn << ")");
  } else {
    INFO(report.png_not_drawn);
    REQUIRE(report.png == (dir / "routing.png").string());
    CHECK(fs::file_size(report.png) > 1000);
  }
  fs::remove_all(dir);
}
