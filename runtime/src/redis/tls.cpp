#include "redis/tls.hpp"

#include <fmt/format.h>
#include <boost/asio/ip/address.hpp>
#include <boost/system/system_error.hpp>

#include <openssl/crypto.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <stdexcept>

namespace jobrt::redis::detail {

namespace asio = boost::asio;

namespace {
// Where an SSL object keeps "a client certificate was asked for" (a non-null pointer).
int wanted_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}
char wanted_mark = 1;
// Called when the server asks for a certificate and the context has none: notes it, sends none.
int note_certificate_wanted(SSL* ssl, X509**, EVP_PKEY**) {
  SSL_set_ex_data(ssl, wanted_index(), &wanted_mark);
  return 0;
}
}  // namespace

bool tls_client_certificate_wanted(SSL* ssl) { return SSL_get_ex_data(ssl, wanted_index()) != nullptr; }

boost::asio::ssl::context make_tls_context(const config& cfg) {
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  ctx.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                  asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
  auto use = [](const char* what, const std::string& file, auto&& step) {
    try {
      step();
    } catch (const boost::system::system_error& e) {
      throw std::runtime_error(fmt::format("TLS: cannot use the {} '{}': {}", what, file, e.code().message()));
    }
  };
  if (cfg.tls_verify) {
    if (!cfg.tls_ca_file.empty())
      use("CA file", cfg.tls_ca_file, [&] { ctx.load_verify_file(cfg.tls_ca_file); });
    else
      use("system's CAs", "default paths", [&] { ctx.set_default_verify_paths(); });
  }
  if (!cfg.tls_cert_file.empty()) {
    use("certificate file", cfg.tls_cert_file, [&] { ctx.use_certificate_chain_file(cfg.tls_cert_file); });
    use("key file", cfg.tls_key_file, [&] { ctx.use_private_key_file(cfg.tls_key_file, asio::ssl::context::pem); });
  } else {
    SSL_CTX_set_client_cert_cb(ctx.native_handle(), note_certificate_wanted);
  }
  return ctx;
}

std::string tls_name(const config& cfg) {
  if (!cfg.tls_server_name.empty()) return cfg.tls_server_name;
  boost::system::error_code ec;
  asio::ip::make_address(cfg.host, ec);
  return ec ? cfg.host : std::string();
}

void tls_expect(SSL* ssl, const config& cfg) {
  if (!cfg.tls_verify) {
    SSL_set_verify(ssl, SSL_VERIFY_NONE, nullptr);
    return;
  }
  SSL_set_verify(ssl, SSL_VERIFY_PEER, nullptr);
  auto* param = SSL_get0_param(ssl);
  auto name = tls_name(cfg);
  bool set = name.empty() ? X509_VERIFY_PARAM_set1_ip_asc(param, cfg.host.c_str()) == 1
                          : X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size()) == 1;
  if (!set)
    throw std::runtime_error(
        fmt::format("TLS: cannot check the server's certificate for '{}' (not a name or an "
                    "address OpenSSL takes; give sni=NAME)",
                    name.empty() ? cfg.host : name));
}

std::string tls_failure(const boost::system::error_code& ec, SSL* ssl) {
  if (ssl != nullptr && (SSL_get_verify_mode(ssl) & SSL_VERIFY_PEER) != 0) {
    auto verdict = SSL_get_verify_result(ssl);
    if (verdict == X509_V_ERR_HOSTNAME_MISMATCH || verdict == X509_V_ERR_IP_ADDRESS_MISMATCH) {
      auto* param = SSL_get0_param(ssl);
      const char* name = X509_VERIFY_PARAM_get0_host(param, 0);
      auto ip = X509_VERIFY_PARAM_get1_ip_asc(param);
      auto expected = name != nullptr ? std::string(name) : ip != nullptr ? std::string(ip) : std::string("?");
      OPENSSL_free(ip);
      return fmt::format("the server's certificate is refused: it does not name '{}'", expected);
    }
    if (verdict != X509_V_OK)
      return fmt::format("the server's certificate is refused: {}", X509_verify_cert_error_string(verdict));
  }
  return ec.message();
}

}  // namespace jobrt::redis::detail
