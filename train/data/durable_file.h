// Small durable-file helpers of the data layer: a dataset's manifest, prep's state and the
// tokenizer copy are replaced atomically (path.tmp written, fsynced, renamed, directory
// fsynced), so a crash leaves the old file or the new one, never a mix.
#pragma once

#include <string>

namespace mod::data {

// fsyncs a file or (dir) a directory; a path that cannot be opened is skipped.
void fsync_path(const std::string& path, bool dir);
// Replaces path atomically with text; errors name the path.
void write_file_atomic(const std::string& path, const std::string& text);
// The whole file; an error naming the path when it cannot be read.
std::string read_whole_file(const std::string& path);

}  // namespace mod::data
