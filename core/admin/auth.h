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
// origin: the console's own page may, another site's may not.
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
  std::string name;  // the token's name; "loopback" for an anonymous local caller
  Role role = Role::Viewer;
  std::vector<std::string> routes;  // empty: all
  bool may_act_on(const std::string& route) const;
};

/// What a request needs.
enum class Need {
  Probe,  ///< /metrics, /livez, /readyz
  Read,   ///< data: the API's GETs, /status, /routes
  Route,  ///< an action on one route (operator of that route, or admin)
  Host,   ///< an action on the whole host (admin)
};

class Auth {
 public:
  Auth(std::vector<config::AdminToken> tokens, bool loopback, bool open_probes);

  struct Verdict {
    std::optional<Caller> caller;  // none: refused
    int status = 200;              // 401 (no or a wrong token) or 403 (not allowed)
    std::string why;
  };
  /// `authorization` is the request's header, `origin` its Origin (empty
  /// when absent), `own_origin` the port's ("https://host:port" as the
  /// client named it in Host), `route` the one acted on (Need::Route).
  Verdict check(Need need, std::string_view authorization, std::string_view origin, std::string_view own_origin,
                const std::string& route = "") const;
  bool has_tokens() const { return !tokens_.empty(); }

 private:
  std::optional<Caller> caller_of(std::string_view authorization, std::string& why) const;

  std::vector<config::AdminToken> tokens_;
  bool loopback_;
  bool open_probes_;
};

}  // namespace idemsink::admin
