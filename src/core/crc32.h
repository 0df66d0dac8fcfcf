#pragma once
// CRC-32 (IEEE 802.3, the one zlib and zip use): checkpoint manifests and
// disk offload spill files check their bytes with it.
#include <cstddef>
#include <cstdint>

namespace longctx {

// crc: the CRC of the bytes before these (0 to start), to chain pieces.
uint32_t crc32(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace longctx
