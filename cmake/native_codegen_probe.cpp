// native_codegen_probe: a copy GCC 12.2 gets wrong under -march=native on AVX-512 machines
// (cooperlake seen): the SLP vectoriser stores the constant {1, 1, 1, 0} as a broadcast of 1.
// CMakeLists.txt runs it at configure time; exit 0 means the copy came out right.
#include <cstdint>
#include <vector>

__attribute__((noinline)) int64_t* allocate(int n) { return new int64_t[n]; }
__attribute__((noinline)) bool equals_1110(const int64_t* p) {
  return p[0] == 1 && p[1] == 1 && p[2] == 1 && p[3] == 0;
}

int main() {
  const std::vector<int64_t> want = {1, 1, 1, 0};
  int64_t* got = allocate(4);
  for (int i = 0; i < 4; ++i) got[i] = want[i];
  const bool ok = equals_1110(got);
  delete[] got;
  return ok ? 0 : 1;
}
