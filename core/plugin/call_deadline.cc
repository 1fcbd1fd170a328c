#include "core/plugin/call_deadline.h"

#include <memory>

#include "core/plugin/calls.h"

namespace idemsink::plugin {

namespace asio = boost::asio;

uint64_t call_with_deadline(asio::io_context& io, std::chrono::milliseconds deadline, std::string what, LateAnswer late,
                            std::function<void(idemsink_outcome, std::string)> on_answer) {
  auto timer = std::make_shared<asio::steady_timer>(io, deadline);
  auto deliver = [&io, timer, on_answer = std::move(on_answer)](idemsink_outcome outcome, std::string detail) {
    asio::post(io, [timer, on_answer, outcome, detail = std::move(detail)] {
      timer->cancel();
      on_answer(outcome, detail);
    });
  };
  const uint64_t id = CallRegistry::instance().add(
      [deliver](uint64_t, idemsink_outcome outcome, std::string detail) { deliver(outcome, std::move(detail)); },
      std::move(what));
  timer->async_wait([id, deliver, late = std::move(late)](boost::system::error_code ec) {
    if (!ec && CallRegistry::instance().cancel(id)) deliver(late.outcome, late.detail);
  });
  return id;
}

}  // namespace idemsink::plugin
