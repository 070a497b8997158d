// rdmalloc_options: prints the RDMALLOC_* settings from their one table
// (allocator/options.h).
//   --text      the settings part of `rdmalloc-run --help` (the default)
//   --markdown  docs/TUNING.md's settings table
//   --names     the variables, one a line (the launcher's --NAME=VALUE options)
// rdmalloc-run calls it; //docs:tuning_table_test compares --markdown with
// the doc, and `bazel run //docs:update_tuning_table` writes it there.
#include <cstdio>
#include <cstring>
#include <string>

#include "allocator/options.h"

namespace rdmalloc {
namespace {

constexpr size_t kWidth = 79;

// Stands for a space inside a code span: not a place to break a line.
constexpr char kKeptSpace = '\x01';

// Markdown to plain text: no code span marks, no bold.
std::string Plain(const std::string& markdown) {
  std::string out;
  bool code = false;
  for (size_t i = 0; i < markdown.size(); i++) {
    if (markdown[i] == '`') {
      code = !code;
    } else if (!code && markdown.compare(i, 2, "**") == 0) {
      i++;
    } else {
      out += code && markdown[i] == ' ' ? kKeptSpace : markdown[i];
    }
  }
  return out;
}

// Characters on a terminal: UTF-8 continuation bytes take no column.
size_t Columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

void PrintLine(std::string line) {
  for (char& ch : line)
    if (ch == kKeptSpace) ch = ' ';
  printf("%s\n", line.c_str());
}

// `text` wrapped at kWidth, each line indented by `indent` spaces.
void PrintWrapped(const std::string& text, size_t indent) {
  std::string line(indent, ' ');
  size_t start = 0;
  bool empty = true;
  while (start <= text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(start, end - start);
    start = end + 1;
    if (word.empty()) continue;
    if (!empty && Columns(line) + 1 + Columns(word) > kWidth) {
      PrintLine(line);
      line.assign(indent, ' ');
      empty = true;
    }
    if (!empty) line += ' ';
    line += word;
    empty = false;
  }
  if (!empty) PrintLine(line);
}

// RDMALLOC_REGION_SIZE -> region-size
std::string FlagName(const char* name) {
  std::string flag = name + strlen("RDMALLOC_");
  for (char& ch : flag) {
    if (ch == '_') ch = '-';
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  }
  return flag;
}

std::string Metavar(const Option& o) {
  if (o.values.metavar != nullptr) return o.values.metavar;
  char words[256];
  JoinOptionWords(o.values, "|", words, sizeof words);
  return words;
}

void PrintText() {
  for (const Option& o : kOptions) {
    printf("\n  --%s=%s  (%s)\n", FlagName(o.name).c_str(), Metavar(o).c_str(), o.name);
    PrintWrapped("accepted: " + Plain(o.doc_accepted), 6);
    PrintWrapped("default: " + Plain(o.doc_default), 6);
    PrintWrapped(Plain(o.meaning), 6);
  }
}

// A table cell: a | would end it.
std::string Cell(const std::string& markdown) {
  std::string out;
  for (char ch : markdown) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

void PrintMarkdown() {
  printf("| variable | accepted | default | meaning |\n");
  printf("|---|---|---|---|\n");
  for (const Option& o : kOptions)
    printf("| `%s` | %s | %s | %s |\n", o.name, Cell(o.doc_accepted).c_str(),
           Cell(o.doc_default).c_str(), Cell(o.meaning).c_str());
}

}  // namespace
}  // namespace rdmalloc

int main(int argc, char** argv) {
  using namespace rdmalloc;
  const char* mode = argc > 1 ? argv[1] : "--text";
  if (argc > 2 || (strcmp(mode, "--text") != 0 && strcmp(mode, "--markdown") != 0 &&
                   strcmp(mode, "--names") != 0)) {
    fprintf(stderr, "usage: rdmalloc_options [--text|--markdown|--names]\n");
    return 2;
  }
  if (strcmp(mode, "--markdown") == 0) {
    PrintMarkdown();
  } else if (strcmp(mode, "--names") == 0) {
    for (const Option& o : kOptions) printf("%s\n", o.name);
  } else {
    PrintText();
  }
  return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}
