#include "service/auth/policy.h"

#include <fnmatch.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"

namespace offload::auth {
namespace {

bool Matches(absl::string_view pattern, absl::string_view text) {
  const std::string p(pattern), s(text);
  return fnmatch(p.c_str(), s.c_str(), 0) == 0;
}

bool AnyMatches(const std::vector<std::string>& patterns, absl::string_view text) {
  for (const std::string& p : patterns) {
    if (Matches(p, text)) return true;
  }
  return false;
}

bool IsKnownOperationPattern(absl::string_view pattern, const OperationMap& operations) {
  for (const auto& [path, op] : operations) {
    if (Matches(pattern, op.name)) return true;
  }
  return false;
}

absl::StatusOr<std::vector<std::string>> StringList(const nlohmann::json& j,
                                                    absl::string_view field) {
  if (!j.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": expected a list of strings"));
  }
  std::vector<std::string> out;
  for (const auto& item : j) {
    if (!item.is_string() || item.get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": expected non-empty strings only"));
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

}  // namespace

absl::StatusOr<Operation> OperationOf(const OperationMap& operations, absl::string_view path) {
  auto it = operations.find(path);
  if (it == operations.end()) return absl::NotFoundError(absl::StrCat("no operation for ", path));
  return it->second;
}

absl::StatusOr<Policy> Policy::Parse(absl::string_view json, const OperationMap& operations) {
  nlohmann::json root = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                              /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError("policy: expected a JSON object");
  }
  Policy policy;
  for (const auto& [field, value] : root.items()) {
    if (field == "admins") {
      absl::StatusOr<std::vector<std::string>> admins = StringList(value, "admins");
      if (!admins.ok()) return admins.status();
      policy.admins_ = *std::move(admins);
    } else if (field == "open_verify") {
      if (!value.is_boolean()) return absl::InvalidArgumentError("open_verify: expected a bool");
      policy.open_verify_ = value.get<bool>();
    } else if (field == "grants") {
      if (!value.is_array()) return absl::InvalidArgumentError("grants: expected a list");
      for (size_t i = 0; i < value.size(); ++i) {
        const nlohmann::json& g = value[i];
        const std::string where = absl::StrCat("grants[", i, "]");
        if (!g.is_object()) return absl::InvalidArgumentError(where + ": expected an object");
        Grant grant;
        for (const auto& [name, v] : g.items()) {
          if (name == "client") {
            if (!v.is_string() || v.get<std::string>().empty()) {
              return absl::InvalidArgumentError(where + ".client: expected a non-empty string");
            }
            grant.client = v.get<std::string>();
          } else if (name == "keys" || name == "operations") {
            absl::StatusOr<std::vector<std::string>> list = StringList(v, where + "." + name);
            if (!list.ok()) return list.status();
            (name == "keys" ? grant.keys : grant.operations) = *std::move(list);
          } else {
            return absl::InvalidArgumentError(absl::StrCat(where, ": unknown field ", name));
          }
        }
        if (grant.client.empty()) return absl::InvalidArgumentError(where + ".client: missing");
        for (const std::string& op : grant.operations) {
          if (!IsKnownOperationPattern(op, operations)) {
            return absl::InvalidArgumentError(
                absl::StrCat(where, ".operations: ", op, " matches no operation"));
          }
        }
        policy.grants_.push_back(std::move(grant));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("policy: unknown field ", field));
    }
  }
  return policy;
}

bool Policy::IsAdmin(absl::string_view identity) const { return AnyMatches(admins_, identity); }

bool Policy::Allows(const Grant& grant, absl::string_view operation, absl::string_view key_id,
                    bool any_key) const {
  if (!AnyMatches(grant.operations, operation)) return false;
  return any_key || AnyMatches(grant.keys, key_id);
}

absl::Status Policy::Check(absl::string_view identity, const Operation& op,
                           const std::vector<std::string>& key_ids) const {
  const bool key_management = absl::StartsWith(op.name, "keys.");
  if (key_management && IsAdmin(identity)) return absl::OkStatus();
  if (op.admin) {
    return absl::PermissionDeniedError(
        absl::StrCat("identity ", identity, " is not an admin: ", op.name, " refused"));
  }
  if (op.name == "ed25519.verify" && key_ids.empty() && open_verify_) return absl::OkStatus();
  std::vector<const Grant*> mine;
  for (const Grant& g : grants_) {
    if (Matches(g.client, identity)) mine.push_back(&g);
  }
  const auto allowed = [&](absl::string_view key_id, bool any_key) {
    for (const Grant* g : mine) {
      if (Allows(*g, op.name, key_id, any_key)) return true;
    }
    return false;
  };
  if (key_ids.empty()) {
    if (allowed("", /*any_key=*/true)) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("identity ", identity, " has no grant for ", op.name));
  }
  for (const std::string& key_id : key_ids) {
    if (!allowed(key_id, /*any_key=*/false)) {
      return absl::PermissionDeniedError(absl::StrCat("identity ", identity, " has no grant for ",
                                                      op.name, " on key ", key_id));
    }
  }
  return absl::OkStatus();
}

}  // namespace offload::auth
