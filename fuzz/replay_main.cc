// Without libFuzzer (the ordinary gcc build): runs LLVMFuzzerTestOneInput once
// over every file of the corpus directories named on the command line, so the
// checked-in corpus is a regression test in every configuration. Flags
// (-max_total_time=...) are libFuzzer's and are ignored here.
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int RunFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    return 0;
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int inputs = 0;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg.empty() || arg[0] == '-') continue;
    struct stat st;
    if (stat(arg.c_str(), &st) != 0) {
      fprintf(stderr, "replay: no such file or directory: %s\n", arg.c_str());
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      inputs += RunFile(arg);
      continue;
    }
    DIR* dir = opendir(arg.c_str());
    if (dir == nullptr) return 1;
    while (dirent* e = readdir(dir)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      inputs += RunFile(arg + "/" + name);
    }
    closedir(dir);
  }
  printf("replay: %d inputs ran without a finding (not fuzzing: build with --config=fuzz)\n", inputs);
  if (inputs == 0) {
    fprintf(stderr, "replay: no inputs: the seed corpus is missing\n");
    return 1;
  }
  return 0;
}
