// The replay driver: runs a fuzz target without libFuzzer, deterministically,
// so CI (GCC, no clang) runs every target on every change. It feeds each
// file of the seed corpus, then `count` inputs derived from them by a
// fixed-seed generator (bit flips, byte insertions and deletions, splices of
// two seeds, repeats of a slice, truncation). The same build with clang and
// -fsanitize=fuzzer replaces this file (scripts/fuzz) for open-ended runs.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string mutate(const std::vector<std::string>& seeds, std::mt19937_64& rng) {
  std::string s = seeds[rng() % seeds.size()];
  const int steps = 1 + static_cast<int>(rng() % 8);
  static const std::string kInteresting[] = {"\"",
                                             "\\",
                                             "{",
                                             "}",
                                             "[",
                                             "]",
                                             ":",
                                             ",",
                                             "\n",
                                             "=",
                                             "$",
                                             "${",
                                             "\xC0\xAF",
                                             "\xED\xA0\x80",
                                             "\xF4\x90\x80\x80",
                                             "\xFF",
                                             std::string(1, '\0'),
                                             "\xE4\xB8\xAD",
                                             "9999999999999999999999"};
  for (int i = 0; i < steps; ++i) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 7) {
      case 0:
        if (!s.empty()) s[pos % s.size()] = static_cast<char>(s[pos % s.size()] ^ (1 << (rng() % 8)));
        break;
      case 1: s.insert(pos, 1, static_cast<char>(rng() % 256)); break;
      case 2:
        if (!s.empty()) s.erase(pos % s.size(), 1 + rng() % 4);
        break;
      case 3: s.insert(pos, kInteresting[rng() % std::size(kInteresting)]); break;
      case 4: {
        const std::string& other = seeds[rng() % seeds.size()];
        s = s.substr(0, pos) + other.substr(other.empty() ? 0 : rng() % other.size());
        break;
      }
      case 5: {
        if (s.empty()) break;
        const size_t from = rng() % s.size(), len = 1 + rng() % std::min<size_t>(16, s.size() - from);
        const std::string slice = s.substr(from, len);
        for (int r = static_cast<int>(rng() % 64); r > 0; --r) s.insert(pos, slice);
        break;
      }
      case 6: s.resize(pos); break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR COUNT\n", argv[0]);
    return 2;
  }
  std::vector<std::string> seeds;
  for (const auto& e : std::filesystem::directory_iterator(argv[1])) {
    std::ifstream in(e.path(), std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "no seeds in %s\n", argv[1]);
    return 2;
  }
  for (const auto& s : seeds) LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  std::mt19937_64 rng(20261129);
  const long count = std::stol(argv[2]);
  for (long i = 0; i < count; ++i) {
    const std::string s = mutate(seeds, rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::printf("%zu seeds and %ld derived inputs: no failure\n", seeds.size(), count);
  return 0;
}
