// Transport: what every transport shares.
#include "gyre/collectives/transport.h"

#include <fmt/format.h>

#include "gyre/error.h"

namespace gyre::transport {

Transfer Transport::isend_message(int peer, int, std::span<const std::byte>) {
  throw TransportError(fmt::format(
      "{} transport: sending a message of unknown length to rank {} is not supported", name(),
      peer));
}

Transfer Transport::irecv_message(int peer, int, std::span<std::byte>, std::size_t*) {
  throw TransportError(fmt::format(
      "{} transport: receiving a message of unknown length from rank {} is not supported",
      name(), peer));
}

}  // namespace gyre::transport
