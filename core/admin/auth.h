// Who may do what on the admin port. Tokens come from host.admin_tokens_file
// (and host.admin_token_env, an admin named "admin"), never from the config
// itself; each has a role:
//
//   viewer    reads: /api/v1 GETs, /status, /routes, the console's data
//   operator  also acts on routes (pause, resume, replay, discard, resolve,
//             ask again, release a hold), on all routes or only those listed
//   admin     also acts on the host (pause all fetching, the outbox queue)
//
// Without a token a request is anonymous: it may read only when the port
// listens on loopback, and act only when moreover no token is configured at
// all (the behaviour before roles). /metrics, /livez, /readyz and /healthz
// need nothing unless host.admin_open_probes is off. A request that changes
// something and carries an Origin header must come from the port's own
// origin: the console's own page may, another site's may not. And a request
// for data or an action must name the port by an IP address, localhost or a
// name of host.admin_hostnames in its Host header: a page whose name an
// attacker re-bound to this address (DNS rebinding) is same-origin to the
// browser, but names its own host.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/config.h"

namespace idemsink::admin {

enum class Role { Viewer = 1, Operator = 2, Admin = 3 };
const char* to_string(Role r);

struct Caller {
  std::string name;  // the token's name; "admin port of <host>" for an anonymous local caller
  Role role = Role::Viewer;
  std::vector<std::string> routes;  // empty: all
  bool may_act_on(const std::string& route) const;
};

/// What a request needs.
enum class Need {
  Probe,  ///< /metrics, /livez, /readyz
  Read,   ///< data: the API's GETs, /status, /routes
  Act,    ///< some action, before it is known on which route (operator or admin)
  Route,  ///< an action on one route (operator of that route, or admin)
  Host,   ///< an action on the whole host (admin)
};

class Auth {
 public:
  /// `local_name` names an anonymous caller on loopback in the operator log.
  Auth(std::vector<config::AdminToken> tokens, bool loopback, bool open_probes, const std::string& hostnames,
       std::string local_name);

  struct Verdict {
    std::optional<Caller> caller;  // none: refused
    int status = 200;              // 401 (no or a wrong token) or 403 (not allowed)
    std::string why;
  };
  /// `authorization`, `origin` and `host` are the request's headers (empty
  /// when absent), `scheme` "http" or "https", `route` the one acted on
  /// (Need::Route).
  Verdict check(Need need, std::string_view authorization, std::string_view origin, std::string_view host,
                std::string_view scheme, const std::string& route = "") const;
  bool has_tokens() const { return !tokens_.empty(); }

 private:
  std::optional<Caller> caller_of(std::string_view authorization, std::string& why) const;
  bool known_host(std::string_view host) const;

  std::vector<config::AdminToken> tokens_;
  bool loopback_;
  bool open_probes_;
  std::vector<std::string> hostnames_;
  std::string local_name_;
};

}  // namespace idemsink::admin
