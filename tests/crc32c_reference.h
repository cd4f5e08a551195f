/* CRC32C computed bit by bit, as the definition reads (reflected polynomial 0x82F63B78,
 * initial value and final xor ~0): the tests' reference for the library's table-driven
 * one, independent of its code. */
#ifndef DOS_CRC32C_REFERENCE_H
#define DOS_CRC32C_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

static inline uint32_t ref_crc32c(const void *buf, size_t len)
{
	const unsigned char *p = buf;
	uint32_t crc = 0xFFFFFFFFu;
	for (size_t i = 0; i < len; i++) {
		crc ^= p[i];
		for (int k = 0; k < 8; k++)
			crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
	}
	return ~crc;
}

#endif /* DOS_CRC32C_REFERENCE_H */
