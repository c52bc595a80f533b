// Command-line values of `taxfree bench`: sizes, integers and --shape entries (harness.h).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "taxfree/bench/harness.h"
#include "taxfree/bench/op_bench.h"
#include "taxfree/runtime/error.h"

namespace taxfree::bench {

int64_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  TF_REQUIRE(!text.empty() && end != text.c_str() && !std::isspace(static_cast<unsigned char>(text[0])),
             Status::InvalidArgument, "size '" << text << "' is not a number (examples: 1024, 64K, 8M, 1G)");
  const std::string unit = end;
  double mul = 1;
  if (unit == "K" || unit == "k" || unit == "KiB") mul = 1024.0;
  else if (unit == "M" || unit == "MiB") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mul = 1024.0 * 1024 * 1024;
  else TF_REQUIRE(unit.empty() || unit == "B", Status::InvalidArgument, "size '" << text << "' has an unknown unit '" << unit << "'");
  // In range before converting: a double past int64 (1e19) or NaN converts to an undefined value.
  const double bytes = x * mul;
  TF_REQUIRE(bytes >= 0 && bytes <= double(kMaxBytes), Status::InvalidArgument,
             "size '" << text << "' is out of range: sizes are 0 to 2^50 bytes (1 PiB)");
  TF_REQUIRE(std::floor(bytes) == bytes, Status::InvalidArgument, "size '" << text << "' must be a whole number of bytes");
  return int64_t(bytes);
}

int64_t parse_int(const std::string& what, const std::string& text, int64_t min, int64_t max) {
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);  // ERANGE: no saturation
  TF_REQUIRE(digits && ec == std::errc() && ptr == text.data() + text.size() && v >= min && v <= max,
             Status::InvalidArgument, what << "=" << text << " is not an integer in [" << min << ", " << max << "]");
  return v;
}

bool within_size_bounds(const Options& o, int64_t bytes) {
  return (o.min_bytes < 0 || bytes >= o.min_bytes) && (o.max_bytes < 0 || bytes <= o.max_bytes);
}

std::vector<int64_t> size_sweep(const Options& o, int64_t def_min, int64_t def_max, int64_t multiple) {
  const int64_t lo = o.min_bytes > 0 ? o.min_bytes : def_min, hi = o.max_bytes > 0 ? o.max_bytes : def_max;
  TF_REQUIRE(lo > 0 && hi >= lo && o.step_factor > 1, Status::InvalidArgument,
             "bad size sweep: -b " << lo << " -e " << hi << " -f " << o.step_factor);
  std::vector<int64_t> out;
  for (double x = double(lo); x <= double(hi) * (1 + 1e-9); x *= o.step_factor) {
    int64_t b = std::max<int64_t>(multiple, int64_t(x) / multiple * multiple);
    if (out.empty() || out.back() != b) out.push_back(b);
  }
  return out;
}

namespace {

// "a,b,,c," -> {"a", "b", "", "c", ""}: every empty item kept (getline drops a trailing one).
std::vector<std::string> split_items(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  for (size_t comma; (comma = text.find(',', start)) != std::string::npos; start = comma + 1)
    items.push_back(text.substr(start, comma - start));
  items.push_back(text.substr(start));
  return items;
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}

}  // namespace

std::map<std::string, std::string> parse_shape_entry(const std::string& entry, const std::vector<ShapeKey>& keys) {
  std::vector<std::string> key_names;
  for (const auto& k : keys) key_names.push_back(k.name);
  const std::string names = key_names.empty() ? "none" : joined(key_names);
  std::map<std::string, std::string> kv;
  for (const std::string& item : split_items(entry)) {
    const auto eq = item.find('=');
    TF_REQUIRE(eq != std::string::npos && eq > 0, Status::InvalidArgument,
               "--shape entry '" << entry << "': " << (item.empty() ? "empty item" : "'" + item + "'")
                                 << "; expected key=value,... with keys " << names);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    auto k = std::find_if(keys.begin(), keys.end(), [&](const ShapeKey& x) { return x.name == key; });
    TF_REQUIRE(k != keys.end(), Status::InvalidArgument,
               "--shape entry '" << entry << "': unknown key '" << key << "' (keys: " << names << ")");
    TF_REQUIRE(!kv.count(key), Status::InvalidArgument, "--shape entry '" << entry << "': key '" << key << "' given twice");
    if (k->choices.empty())
      parse_int("--shape entry '" + entry + "': " + key, value, 1, k->max);
    else
      TF_REQUIRE(std::find(k->choices.begin(), k->choices.end(), value) != k->choices.end(), Status::InvalidArgument,
                 "--shape entry '" << entry << "': " << key << "=" << value << " is not one of " << joined(k->choices));
    kv[key] = value;
  }
  return kv;
}

int64_t shape_int(const std::map<std::string, std::string>& kv, const std::string& key, int64_t def) {
  const auto it = kv.find(key);
  return it == kv.end() ? def : parse_int(key, it->second, 0, INT64_MAX);
}

void check_shape_entries(const std::vector<std::string>& entries, const std::vector<ShapeKey>& keys) {
  for (const std::string& e : entries) parse_shape_entry(e, keys);
}

// An op that names no --shape keys takes no --shape entries.
void OpBench::check_options(const Options& opt) const { check_shape_entries(opt.shapes, {}); }

bool matches_shape_filters(const nlohmann::json& params, const std::vector<std::string>& filters) {
  if (filters.empty()) return true;
  for (const auto& f : filters) {
    bool all = true;
    std::stringstream ss(f);
    std::string kv;
    while (std::getline(ss, kv, ',')) {
      auto eq = kv.find('=');
      TF_REQUIRE(eq != std::string::npos && eq > 0, Status::InvalidArgument,
                 "shape filter '" << f << "' must be key=value[,key=value...]");
      const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      if (!params.contains(k)) { all = false; break; }
      const auto& p = params[k];
      bool eqv = p.is_number() ? (std::strtod(v.c_str(), nullptr) == p.get<double>()) : (p.is_string() && p.get<std::string>() == v);
      if (!eqv) { all = false; break; }
    }
    if (all) return true;
  }
  return false;
}

}  // namespace taxfree::bench
