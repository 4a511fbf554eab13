// A small JSON Schema validator, for the subset docs/plyctl.schema.json
// uses (python3's jsonschema is not installed here): type, enum,
// properties, required, additionalProperties (false), items, minItems,
// maxItems, minimum, pattern, anyOf and $ref into the same document.
// validate() returns the problems, each "PATH: what", empty when valid.
#pragma once

#include <nlohmann/json.hpp>

#include <regex>
#include <string>
#include <vector>

#include "fuse_util.h"

namespace plyfs::fusetest {

class SchemaValidator {
 public:
  explicit SchemaValidator(nlohmann::json root) : root_(std::move(root)) {}

  // The schema of a command ("commands" of the document).
  const nlohmann::json& command(const std::string& name) const { return root_.at("commands").at(name); }

  std::vector<std::string> validate(const nlohmann::json& v, const nlohmann::json& schema) const {
    std::vector<std::string> out;
    check(v, schema, "$", out);
    return out;
  }

 private:
  const nlohmann::json& resolve(const nlohmann::json& s) const {
    if (!s.is_object() || !s.contains("$ref")) return s;
    const std::string ref = s["$ref"];
    if (ref.rfind("#/", 0) != 0) throw std::runtime_error("unsupported $ref " + ref);
    return resolve(root_.at(nlohmann::json::json_pointer(ref.substr(1))));
  }

  static bool has_type(const nlohmann::json& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "integer") return v.is_number_integer();
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    throw std::runtime_error("unsupported type " + t);
  }

  void check(const nlohmann::json& v, const nlohmann::json& schema, const std::string& path,
             std::vector<std::string>& out) const {
    const nlohmann::json& s = resolve(schema);
    static const std::vector<std::string> kKnown = {
        "$ref", "type", "enum", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
        "minimum", "pattern", "anyOf", "description"};
    for (const auto& [k, _] : s.items())
      if (std::find(kKnown.begin(), kKnown.end(), k) == kKnown.end())
        throw std::runtime_error("the validator does not know keyword " + k);
    if (s.contains("type")) {
      std::vector<std::string> types;
      if (s["type"].is_array()) types = s["type"].get<std::vector<std::string>>();
      else types.push_back(s["type"]);
      bool any = false;
      for (const auto& t : types) any |= has_type(v, t);
      if (!any) return out.push_back(path + ": not of type " + s["type"].dump() + ": " + v.dump());
    }
    if (s.contains("enum")) {
      bool found = false;
      for (const auto& e : s["enum"]) found |= e == v;
      if (!found) out.push_back(path + ": " + v.dump() + " is not one of " + s["enum"].dump());
    }
    if (s.contains("anyOf")) {
      bool any = false;
      for (const auto& alt : s["anyOf"]) {
        std::vector<std::string> sub;
        check(v, alt, path, sub);
        any |= sub.empty();
      }
      if (!any) out.push_back(path + ": matches none of anyOf: " + v.dump());
    }
    if (s.contains("minimum") && v.is_number() && v.get<double>() < s["minimum"].get<double>())
      out.push_back(path + ": below the minimum");
    if (s.contains("pattern") && v.is_string() &&
        !std::regex_search(v.get<std::string>(), std::regex(s["pattern"].get<std::string>())))
      out.push_back(path + ": does not match " + s["pattern"].get<std::string>());
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) out.push_back(path + ": too few items");
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) out.push_back(path + ": too many items");
      if (s.contains("items"))
        for (size_t i = 0; i < v.size(); i++) check(v[i], s["items"], path + "[" + std::to_string(i) + "]", out);
    }
    if (v.is_object()) {
      if (s.contains("required"))
        for (const auto& r : s["required"])
          if (!v.contains(r.get<std::string>())) out.push_back(path + ": lacks " + r.get<std::string>());
      for (const auto& [k, x] : v.items()) {
        if (s.contains("properties") && s["properties"].contains(k)) check(x, s["properties"][k], path + "." + k, out);
        else if (s.contains("additionalProperties") && s["additionalProperties"] == false)
          out.push_back(path + ": unexpected member " + k);
      }
    }
  }

  nlohmann::json root_;
};

// docs/plyctl.schema.json, read once.
inline const SchemaValidator& schema() {
  static SchemaValidator v(nlohmann::json::parse(slurp(tool("PLYFS_SCHEMA"))));
  return v;
}

// `text` parsed, and valid by the schema of plyctl command `command`
// (CHECKed, with the problems as the message); the parsed JSON.
inline nlohmann::json schema_checked(const std::string& command, const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  INFO(command << ": " << text);
  REQUIRE(!j.is_discarded());
  const auto problems = schema().validate(j, schema().command(command));
  std::string all;
  for (const auto& p : problems) all += p + "\n";
  INFO("schema problems:\n" << all);
  CHECK(problems.empty());
  return j;
}

}  // namespace plyfs::fusetest
