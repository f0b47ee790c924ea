// net.h — what the network-facing parts agree on about addresses: whether a host names this machine's
// loopback interface, decided by parsing the address, never by a string prefix.
// Owns: is_loopback_host. Does not own: resolving names (only "localhost" is taken as loopback by name).
#pragma once
#include <string>

namespace ration {

// "localhost", an IPv4 address in 127.0.0.0/8 (dotted quad, as inet_pton reads it), "::1" / "[::1]", or an
// IPv4-mapped loopback ("::ffff:127.0.0.1"). Anything else, "127.evil.example" included, is not.
bool is_loopback_host(const std::string& host);

}  // namespace ration
