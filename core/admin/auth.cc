#include "core/admin/auth.h"

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cctype>
#include <sstream>

namespace idemsink::admin {
namespace {

// Compares without an early exit, so response time says nothing about how
// much of a guessed token was right.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

Role role_of(const std::string& s) {
  if (s == "admin") return Role::Admin;
  if (s == "operator") return Role::Operator;
  return Role::Viewer;
}

}  // namespace

const char* to_string(Role r) {
  switch (r) {
    case Role::Viewer: return "viewer";
    case Role::Operator: return "operator";
    case Role::Admin: return "admin";
  }
  return "?";
}

bool Caller::may_act_on(const std::string& route) const {
  if (role == Role::Admin) return true;
  if (role != Role::Operator) return false;
  return routes.empty() || std::find(routes.begin(), routes.end(), route) != routes.end();
}

Auth::Auth(std::vector<config::AdminToken> tokens, bool loopback, bool open_probes, const std::string& hostnames,
           std::string local_name)
    : tokens_(std::move(tokens)), loopback_(loopback), open_probes_(open_probes), local_name_(std::move(local_name)) {
  std::istringstream list(hostnames);
  for (std::string name; std::getline(list, name, ',');) {
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (!name.empty()) hostnames_.push_back(name);
  }
}

bool Auth::known_host(std::string_view host) const {
  // Without its port: "name:9464", "[::1]:9464".
  std::string name(host);
  if (name.starts_with('[')) {
    name = name.substr(0, name.find(']') + 1);
  } else if (const auto colon = name.rfind(':'); colon != std::string::npos) {
    name.resize(colon);
  }
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (name == "localhost") return true;
  boost::system::error_code ec;
  const std::string literal = name.starts_with('[') ? name.substr(1, name.size() - 2) : name;
  boost::asio::ip::make_address(literal, ec);
  if (!ec) return true;  // an IP address: no name to re-bind
  return std::find(hostnames_.begin(), hostnames_.end(), name) != hostnames_.end();
}

std::optional<Caller> Auth::caller_of(std::string_view authorization, std::string& why) const {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.empty()) {
    why = "missing bearer token";
    return std::nullopt;
  }
  if (authorization.substr(0, kBearer.size()) != kBearer) {
    why = "the Authorization header is not \"Bearer <token>\"";
    return std::nullopt;
  }
  const std::string_view secret = authorization.substr(kBearer.size());
  std::optional<Caller> found;
  for (const auto& t : tokens_)  // every token compared: the time says nothing of which matched
    if (same_secret(secret, t.secret) && !found) found = Caller{t.name, role_of(t.role), t.routes};
  if (!found) why = "wrong bearer token";
  return found;
}

Auth::Verdict Auth::check(Need need, std::string_view authorization, std::string_view origin, std::string_view host,
                          std::string_view scheme, const std::string& route) const {
  const bool acting = need == Need::Act || need == Need::Route || need == Need::Host;
  if (need == Need::Probe && open_probes_) return {Caller{"anonymous", Role::Viewer, {}}, 200, ""};
  if (!known_host(host))
    return {std::nullopt, 403,
            "Host \"" + std::string(host) +
                "\" is not a name of this admin port (an IP address, localhost, or host.admin_hostnames)"};
  if (acting && !origin.empty() && origin != std::string(scheme) + "://" + std::string(host))
    return {std::nullopt, 403, "a request from another origin (" + std::string(origin) + ") is refused"};
  std::string why;
  std::optional<Caller> caller;
  if (!authorization.empty() || tokens_.empty() == false) caller = caller_of(authorization, why);
  if (!caller) {
    // Anonymous: reads from this machine; actions too while no token exists.
    const bool anonymous_ok = loopback_ && authorization.empty() && (!acting || tokens_.empty());
    if (!anonymous_ok) {
      // No token could do: forbidden, rather than a question for credentials.
      if (authorization.empty() && !loopback_ && tokens_.empty())
        return {std::nullopt, 403,
                "the admin port listens beyond loopback and no token is configured (host.admin_token_env or "
                "host.admin_tokens_file)"};
      if (authorization.empty() && loopback_ && acting) why = "actions need a bearer token when tokens are configured";
      return {std::nullopt, 401, why};
    }
    caller = Caller{local_name_, acting ? Role::Admin : Role::Viewer, {}};
  }
  if (need == Need::Act && caller->role == Role::Viewer)
    return {std::nullopt, 403, "token " + caller->name + " (viewer) may not act"};
  if (need == Need::Route && !caller->may_act_on(route))
    return {std::nullopt, 403,
            "token " + caller->name + " (" + to_string(caller->role) + ") may not act on route " + route};
  if (need == Need::Host && caller->role != Role::Admin)
    return {std::nullopt, 403, "token " + caller->name + " (" + to_string(caller->role) + ") may not act on the host"};
  return {caller, 200, ""};
}

}  // namespace idemsink::admin
