// rediss://: connections over TLS to a redis-server with a TLS port, with certificates this file
// makes with the openssl command (a CA, the server's for 127.0.0.1, a client's; and a CA that
// signed none of them).
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/producer.hpp>
#include <jobrt/redis/connection.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::test;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;
using asio::awaitable;

namespace {

void sh(const std::string& command) {
  if (std::system((command + " >/dev/null 2>&1").c_str()) != 0) throw std::runtime_error("failed: " + command);
}

// Certificates in a throw-away directory.
struct certificates {
  std::string dir;
  certificates() {
    char tmpl[] = "/tmp/jobrt-tls-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir = tmpl;
    auto ca = [&](const std::string& name) {
      sh(fmt::format(
          "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN={0} -keyout {1}/{0}.key -out {1}/{0}.crt", name,
          dir));
    };
    auto signed_by = [&](const std::string& name, const std::string& issuer, const std::string& ext) {
      sh(fmt::format("openssl req -newkey rsa:2048 -nodes -subj /CN={0} -keyout {1}/{0}.key -out {1}/{0}.csr", name,
                     dir));
      sh(
          fmt::format("printf '{3}' > {1}/{0}.ext && openssl x509 -req -in {1}/{0}.csr -CA {1}/{2}.crt -CAkey "
                      "{1}/{2}.key -CAcreateserial -days 2 -extfile {1}/{0}.ext -out {1}/{0}.crt",
                      name, dir, issuer, ext));
    };
    ca("ca");
    ca("other-ca");
    signed_by("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\\n");
    signed_by("client", "ca", "extendedKeyUsage=clientAuth\\n");
    signed_by("named", "ca", "subjectAltName=DNS:localhost\\n");  // a name, no address
    // One that expired long ago: `openssl ca` is what sets dates in the past.
    sh(
        fmt::format("openssl req -newkey rsa:2048 -nodes -subj /CN=expired -keyout {0}/expired.key -out "
                    "{0}/expired.csr",
                    dir));
    sh(
        fmt::format("cd {} && mkdir newcerts && touch index.txt && printf '{}' > ca.cnf && printf "
                    "'subjectAltName=IP:127.0.0.1\\n' > expired.ext && openssl ca -batch -config ca.cnf "
                    "-create_serial -cert ca.crt -keyfile ca.key -in expired.csr -out expired.crt -startdate "
                    "20200101000000Z -enddate 20200102000000Z -extfile expired.ext -notext",
                    dir,
                    "[ca]\\ndefault_ca = any\\n[any]\\ndatabase = index.txt\\nnew_certs_dir = "
                    "newcerts\\nserial = serial\\ndefault_md = sha256\\npolicy = anything\\n[anything]\\n"
                    "commonName = supplied\\n"));
  }
  ~certificates() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string file(const std::string& name) const { return dir + "/" + name; }
};

// A redis-server with a TLS port beside its plain one; `clients`: tls-auth-clients (yes: a
// client must show a certificate the CA signed); `cert`: the server's certificate.
struct tls_server {
  const certificates& certs;
  int tls_port = free_port();
  redis_server server;
  tls_server(const certificates& c, bool clients, const std::string& cert = "server")
      : certs(c),
        server({"--tls-port", std::to_string(tls_port), "--tls-cert-file", c.file(cert + ".crt"), "--tls-key-file",
                c.file(cert + ".key"), "--tls-ca-cert-file", c.file("ca.crt"), "--tls-auth-clients",
                clients ? "yes" : "no"}) {}
  std::string url(const std::string& params) const {
    return fmt::format("rediss://127.0.0.1:{}{}", tls_port, params.empty() ? "" : "/?" + params);
  }
};

// Connects with `url`; returns "" when PING answered, else the connection's error.
std::string try_ping(const std::string& url) {
  std::string out = "no answer";
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        auto cfg = redis::config::from_url(url);
        cfg.connect_timeout = 2000ms;
        cfg.reconnect_wait_min = 10000ms;  // one attempt: its error is what the test reads
        redis::connection c(ctx.get_executor(), cfg);
        c.start();
        redis::request ping("PING");
        ping.options.timeout = 3000ms;
        try {
          // The PING's answer, or the first attempt's failure, whichever comes first.
          auto first = co_await (redis::exec(c, std::move(ping)) ||
                                 eventually([&] { return c.last_failure() != redis::connect_failure::none; }, 3000ms));
          if (first.index() == 0)
            out = std::get<0>(first).as_string() == "PONG" ? "" : "answered " + std::get<0>(first).as_string();
          else if (std::get<1>(first))
            out = c.last_error();
          else
            out = "no answer within 3 s";
        } catch (const std::exception& e) {
          out = c.last_error().empty() ? e.what() : c.last_error();
        }
        c.close();
      },
      20s);
  return out;
}

}  // namespace

TEST_CASE("rediss:// - the URL's TLS parameters, and what it refuses") {
  auto cfg = redis::config::from_url("rediss://u:p@db.example:6390/2?ca=/etc/ca.pem&cert=/c.pem&key=/k.pem&sni=cache");
  CHECK(cfg.tls);
  CHECK(cfg.tls_verify);
  CHECK(cfg.host == "db.example");
  CHECK(cfg.database == 2);
  CHECK(cfg.tls_ca_file == "/etc/ca.pem");
  CHECK(cfg.tls_cert_file == "/c.pem");
  CHECK(cfg.tls_key_file == "/k.pem");
  CHECK(cfg.tls_server_name == "cache");
  CHECK(cfg.address() == "rediss://db.example:6390/2");
  CHECK_FALSE(redis::config::from_url("rediss://h:1/?verify=none").tls_verify);
  CHECK_FALSE(redis::config::from_url("redis://h:1").tls);
  auto refused = [](const char* url) {
    try {
      redis::config::from_url(url);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refused("rediss://h:1/?verify=maybe").find("verify='maybe'") != std::string::npos);
  CHECK(refused("rediss://h:1/?cert=/c.pem").find("cert and key go together") != std::string::npos);
  CHECK(refused("rediss://h:1/?bogus=1").find("unknown parameter 'bogus'") != std::string::npos);
  CHECK(refused("redis://h:1/?ca=/x").find("parameters are for rediss:// and redis+sentinel://") != std::string::npos);
  CHECK(refused("http://h:1").find("scheme 'http'") != std::string::npos);
}

TEST_CASE("rediss:// - commands go over TLS with the server verified, mutual TLS too, and a worker runs jobs") {
  certificates certs;
  tls_server plain(certs, false);
  CHECK(try_ping(plain.url("ca=" + certs.file("ca.crt"))).empty());
  CHECK(try_ping(plain.url("ca=" + certs.file("ca.crt") + "&sni=localhost")).empty());
  tls_server mutual(certs, true);
  auto client =
      fmt::format("ca={}&cert={}&key={}", certs.file("ca.crt"), certs.file("client.crt"), certs.file("client.key"));
  CHECK(try_ping(mutual.url(client)).empty());
  // A producer and a worker over TLS: jobs enqueued, claimed, run and acked.
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        redis_backend store(ctx.get_executor(), redis::config::from_url(mutual.url(client)));
        producer p(store, "tls");
        std::vector<job_spec> specs;
        for (int i = 0; i < 200; ++i) {
          job_spec spec;
          spec.type = "t";
          spec.group = fmt::format("g{}", i % 7);
          specs.push_back(std::move(spec));
        }
        co_await p.enqueue_bulk(std::move(specs));
        int done = 0;
        worker_options o;
        o.queue = "tls";
        o.concurrency = 8;
        worker w(ctx.get_executor(), store, o);
        w.add_handler("t", [&](job_context&) -> awaitable<void> {
          ++done;
          co_return;
        });
        w.start();
        CHECK(co_await eventually([&] { return done == 200; }, 20s));
        co_await w.stop(5s);
        CHECK((co_await store.counts("tls")).completed == 200);
      },
      60s);
}

TEST_CASE(
    "rediss:// - a wrong CA, an expired certificate, a name the certificate does not hold and a missing client "
    "certificate each fail, saying why") {
  certificates certs;
  tls_server plain(certs, false);
  auto wrong_ca = try_ping(plain.url("ca=" + certs.file("other-ca.crt")));
  INFO(wrong_ca);
  CHECK(wrong_ca.find("TLS handshake failed") != std::string::npos);
  CHECK(wrong_ca.find("certificate") != std::string::npos);
  tls_server expired(certs, false, "expired");
  auto too_old = try_ping(expired.url("ca=" + certs.file("ca.crt")));
  INFO(too_old);
  CHECK(too_old.find("certificate has expired") != std::string::npos);
  auto wrong_name = try_ping(plain.url("ca=" + certs.file("ca.crt") + "&sni=db.example"));
  INFO(wrong_name);
  CHECK(wrong_name.find("it does not name 'db.example'") != std::string::npos);
  // A certificate that names localhost but holds no address: refused at 127.0.0.1, taken by name.
  tls_server named(certs, false, "named");
  auto by_address = try_ping(named.url("ca=" + certs.file("ca.crt")));
  INFO(by_address);
  CHECK(by_address.find("it does not name '127.0.0.1'") != std::string::npos);
  CHECK(try_ping(named.url("ca=" + certs.file("ca.crt") + "&sni=localhost")).empty());
  // Not verified, by name: a certificate no trusted CA signed is let through.
  CHECK(try_ping(plain.url("verify=none")).empty());
  auto missing = try_ping(plain.url("ca=" + certs.file("nowhere.crt")));
  CHECK(missing.find("cannot use the CA file '" + certs.file("nowhere.crt") + "'") != std::string::npos);
  tls_server mutual(certs, true);
  auto no_client_cert = try_ping(mutual.url("ca=" + certs.file("ca.crt")));
  INFO(no_client_cert);
  CHECK_FALSE(no_client_cert.empty());
  CHECK(no_client_cert.find("the server asked for a client certificate and none was given") != std::string::npos);
  // A plain client at the TLS port: the server never answers in RESP.
  CHECK_FALSE(try_ping(fmt::format("redis://127.0.0.1:{}", plain.tls_port)).empty());
}

namespace {
// Enqueues one job of type "t", again until it is stored (while the server is gone or back).
awaitable<void> enqueue_one(producer& p) {
  for (int tries = 0;; ++tries) {
    try {
      job_spec spec;
      spec.type = "t";
      co_await p.enqueue(std::move(spec));
      co_return;
    } catch (const std::exception&) {
      if (tries == 100) throw;
    }
    co_await sleep_for(100ms);
  }
}
}  // namespace

TEST_CASE("rediss:// - after CLIENT KILL and a server restart the connections come back over TLS, and jobs go on") {
  certificates certs;
  tls_server s(certs, false);
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        redis_backend store(ctx.get_executor(), redis::config::from_url(s.url("ca=" + certs.file("ca.crt"))));
        producer p(store, "tls-faults");
        int done = 0;
        worker_options o;
        o.queue = "tls-faults";
        worker w(ctx.get_executor(), store, o);
        w.add_handler("t", [&](job_context&) -> awaitable<void> {
          ++done;
          co_return;
        });
        w.start();
        co_await enqueue_one(p);
        CHECK(co_await eventually([&] { return done == 1; }, 10s));
        // Every TLS client dropped by the server (at its plain port).
        auto connects = store.connection().connect_count();
        redis_cli(s.server.config(), {"CLIENT", "KILL", "TYPE", "normal"});
        co_await enqueue_one(p);
        CHECK(co_await eventually([&] { return done == 2; }, 10s));
        CHECK(store.connection().connect_count() > connects);
        // The server stopped and started again, on its ports, empty.
        connects = store.connection().connect_count();
        s.server.stop();
        s.server.start();
        co_await enqueue_one(p);
        CHECK(co_await eventually([&] { return done == 3; }, 15s));
        CHECK(store.connection().connect_count() > connects);
        co_await w.stop(5s);
      },
      60s);
}
