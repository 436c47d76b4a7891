// SPDX-License-Identifier: Apache-2.0
// main() for a fuzz target built without libFuzzer: runs LLVMFuzzerTestOneInput on each
// file named on the command line, or on every file of each directory named (in name
// order), so that the default build replays the corpus as a host-suite test. Exits 1
// when a directory holds no input (a corpus that went missing must not pass).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {
bool replay(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "replay: cannot read %s\n", p.c_str());
    return false;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", p.c_str(), bytes.size());
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  std::size_t n = 0;
  for (int a = 1; a < argc; ++a) {
    const std::filesystem::path p(argv[a]);
    if (std::filesystem::is_directory(p)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      if (files.empty()) {
        std::fprintf(stderr, "replay: %s holds no input\n", p.c_str());
        return 1;
      }
      for (const auto& f : files) {
        if (!replay(f)) return 1;
        ++n;
      }
    } else {
      if (!replay(p)) return 1;
      ++n;
    }
  }
  std::printf("replayed %zu inputs\n", n);
  return n == 0 ? 1 : 0;
}
