// Boost.Asio for the core. Boost 1.74's awaitable.hpp uses std::exchange
// without including <utility>: the workaround lives here, once. (Plugins
// build against the SDK alone and keep their own line.)
#pragma once

#include <utility>
#include <boost/asio.hpp>
