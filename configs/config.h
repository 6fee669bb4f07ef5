// Loading a RunConfig: a text-format recipe, then --set overrides, then validation. Every error
// names the file or the field path (e.g. "model.mod.capacity") and what was expected.
#pragma once

#include <string>
#include <vector>

#include "configs/modtrain.pb.h"

namespace mod::config {

// Parses a text-format RunConfig; unknown fields and syntax errors name the file and line.
modtrain::RunConfig load_text(const std::string& path);
modtrain::RunConfig parse_text(const std::string& text, const std::string& origin);

// Applies "path.to.field=value" (repeated fields take "a,b,c" or "[a, b, c]").
void apply_override(modtrain::RunConfig& cfg, const std::string& assignment);

// Throws std::invalid_argument naming the first invalid field.
void validate(const modtrain::RunConfig& cfg);

// parse_text + validate, for configs that arrive inside other files (weights metadata,
// checkpoints): errors "config <origin>: <field>: <what>".
modtrain::RunConfig parse_checked(const std::string& text, const std::string& origin);
void validate_from(const modtrain::RunConfig& cfg, const std::string& origin);

// load_text + overrides + validate.
modtrain::RunConfig load(const std::string& path, const std::vector<std::string>& overrides);

std::string to_text(const modtrain::RunConfig& cfg);

// What data parallelism shards (parallel.zero_stage; the old parallel.zero1: true is stage 1):
// 0 nothing, 1 optimizer state, 2 also the reduced gradients, 3 also the parameters.
// validate() refuses a config that names both fields.
int zero_stage(const modtrain::ParallelConfig& p);

// Whether training captures its step as a CUDA graph: train.cuda_graph where set, else on for
// one process on a CUDA device (parallel.dp, tp and ep all 1), off otherwise.
bool cuda_graph_on(const modtrain::RunConfig& cfg);

// Shared by every text-format file (RunConfig, GridSpec): parses text into out, or throws
// std::invalid_argument "<kind> <origin>:<line>:<column>: <message>".
void parse_text_message(const std::string& text, const std::string& origin,
                        google::protobuf::Message& out, const std::string& kind);
// The whole file; an error "<kind>: cannot open <path>" when it cannot be read.
std::string read_text_file(const std::string& path, const std::string& kind);

}  // namespace mod::config
