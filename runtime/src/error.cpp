#include <jobrt/error.hpp>

#include <string>

namespace jobrt {
namespace {

class category final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "jobrt"; }

  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::not_connected: return "not connected to the Redis server";
      case errc::connection_lost: return "connection lost after the request was written; it may or may not have run";
      case errc::timeout: return "request timed out";
      case errc::closed: return "connection closed";
      case errc::protocol_error:
        return "the server sent a reply this client cannot read (not RESP, or arrays nested over 7 deep)";
      case errc::server_error: return "the server answered with an error reply";
      case errc::blocking_command_on_shared_connection:
        return "blocking command on the shared connection; use a blocking_connection";
      case errc::health_check_failed: return "nothing read from the server for two health intervals";
      case errc::handshake_failed: return "the server refused the connection handshake";
      case errc::invalid_request:
        return "empty request, a pub/sub command on a connection that is not a subscriber, a MULTI without its "
               "EXEC or DISCARD in the same request, or a command that changes the connection (HELLO, AUTH, "
               "SELECT, RESET, QUIT, CLIENT REPLY; set user, password and database in the config)";
      case errc::not_replicated: return "written at the primary, but not acknowledged by enough replicas in time";
      case errc::bad_batch: return "the job count does not match the arguments";
      case errc::bad_job_id: return "job id refused";
      case errc::bad_max_attempts: return "job max_attempts refused";
      case errc::bad_due: return "job due time refused";
      case errc::group_busy: return "the group is running or waiting to run";
      case errc::shards_mismatch: return "the queue is stored with another number of shards";
      case errc::group_full: return "the group is full";
    }
    return "unknown jobrt error";
  }
};

}  // namespace

const boost::system::error_category& error_category() noexcept {
  static const category instance;
  return instance;
}

}  // namespace jobrt
