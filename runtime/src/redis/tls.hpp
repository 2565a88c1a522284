// TLS for a connection (rediss://): the client context a config asks for, and what a failed
// handshake means in words.
#pragma once

#include <jobrt/redis/config.hpp>

#include <boost/asio/ssl/context.hpp>
#include <boost/system/error_code.hpp>

#include <openssl/ssl.h>

#include <string>

namespace jobrt::redis::detail {

// A client context: the CAs to trust (cfg.tls_ca_file, else the system's) unless verification is
// off, and the client's certificate and key when given. Throws std::runtime_error naming the file
// that could not be used and why.
boost::asio::ssl::context make_tls_context(const config& cfg);

// The name to send as SNI and to verify: cfg.tls_server_name, else the host unless it is an IP
// address ("" then: no SNI, the address is verified).
std::string tls_name(const config& cfg);

// Sets what `ssl` checks the server's certificate against: verification as cfg asks, and the
// certificate must name tls_name(cfg), or hold the host's IP address when that is empty. Throws
// std::runtime_error when OpenSSL cannot take that name or address (a check never goes unset).
void tls_expect(SSL* ssl, const config& cfg);

// Whether the server asked for a client certificate in `ssl`'s handshake while none was given
// (make_tls_context's contexts note it): a server that requires one (tls-auth-clients) may end
// the connection before its alert can be read.
bool tls_client_certificate_wanted(SSL* ssl);

// Why a handshake failed: the certificate check's verdict when the certificate was checked and
// refused ("certificate has expired", "unable to get local issuer certificate"), else the
// error's text.
std::string tls_failure(const boost::system::error_code& ec, SSL* ssl);

}  // namespace jobrt::redis::detail
