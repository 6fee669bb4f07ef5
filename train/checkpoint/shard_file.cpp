// Shard file writer and piece reader (see shard_file.h).
#include "train/checkpoint/shard_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "core/util/crc32c.h"
#include "core/util/file_io.h"
#include "train/checkpoint/metadata.h"

namespace mod::ckpt {

namespace {
constexpr char kMagic[8] = {'M', 'O', 'D', 'S', 'H', 'A', 'R', 'D'};

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t rank;
  uint64_t pieces;
  char zeros[kShardAlign - 24];
};
static_assert(sizeof(Header) == kShardAlign);

uint64_t align_up(uint64_t n) {
  return (n + kShardAlign - 1) / kShardAlign * kShardAlign;
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}
}  // namespace

std::string shard_file_name(int rank) {
  return "shard_" + std::to_string(rank) + ".bin";
}

modtrain::ckpt::RankPieces write_shard_file(const std::string& path, int rank,
                                            const std::vector<TensorEntry>& entries) {
  const std::string file = path.substr(path.find_last_of('/') + 1);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kFormatVersion;
  h.rank = static_cast<uint32_t>(rank);
  h.pieces = entries.size();
  util::OutFile out(path);
  out.write(&h, sizeof h);
  modtrain::ckpt::RankPieces pieces;
  for (const TensorEntry& e : entries) {
    out.pad_to(align_up(out.size()));
    auto* info = pieces.add_tensors();
    info->set_name(e.name);
    info->set_dtype(dtype_name(e.local.dtype()));
    for (int64_t d : e.global_shape) info->add_global_shape(d);
    auto* p = info->add_pieces();
    p->set_file(file);
    p->set_shard_dim(e.shard_dim);
    p->set_offset(e.shard_dim < 0 ? 0 : e.shard_offset);
    for (int64_t d : e.local.shape()) p->add_local_shape(d);
    p->set_byte_offset(out.size());
    p->set_byte_length(e.local.nbytes());
    p->set_crc32c(crc32c(e.local.raw_data(), e.local.nbytes()));
    out.write(e.local.raw_data(), e.local.nbytes());
  }
  out.close();
  return pieces;
}

Tensor read_piece(const std::string& dir, const std::string& tensor_name, DType dtype,
                  const modtrain::ckpt::Piece& piece) {
  const std::string path = dir + "/" + piece.file();
  const std::string where = "checkpoint " + path + ": tensor " + tensor_name + ": ";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error(where + "cannot open the shard file: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw std::runtime_error(where + "cannot stat: " + std::strerror(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  Header h{};
  if (size < sizeof h || !util::read_at(fd, &h, sizeof h, 0, path))
    throw std::runtime_error(where + "not a modtrain shard file (no MODSHARD header)");
  check_shard_header(reinterpret_cast<const unsigned char*>(&h), size, where);
  check_piece_range(piece, dtype, size, where);  // before the tensor is allocated
  const uint64_t begin = piece.byte_offset();
  Tensor t = Tensor::empty(Shape(piece.local_shape().begin(), piece.local_shape().end()), dtype);
  if (!util::read_at(fd, t.raw_data(), t.nbytes(), begin, path))
    throw std::runtime_error(where + "unexpected end of file (truncated)");
  const uint32_t computed = crc32c(t.raw_data(), t.nbytes());
  if (computed != piece.crc32c())
    throw std::runtime_error(where + "CRC32C mismatch (stored " + hex(piece.crc32c()) +
                             ", computed " + hex(computed) + ")");
  return t;
}

}  // namespace mod::ckpt
